//! im2col and col2im over plain `f32` slices: the data movement around a convolution's GEMMs.
//!
//! The column matrix of images `n0..n1` is `[K, nc, Ho, Wo]` with `K = Cin·kh·kw` ordered as
//! the weight's `[Cout, Cin, kh, kw]` flattens, so `weight [Cout, K] × columns [K, nc·Ho·Wo]`
//! is the convolution of those images. Both passes split their work into pieces that never
//! write the same element (rows of the column matrix; one (image, channel) plane of the
//! input gradient) and add contributions in a fixed order, so results do not depend on the
//! number of threads.

use std::ops::Range;

use rayon::prelude::*;

use crate::conv::dims::ConvDims;
use crate::conv::im2col::strided::im2col_strided;

/// Images narrower than this take [`ShiftedCopy`]'s one copy per plane. Measured (one
/// thread, 32 images, 3×3, padding 1): 4×4 planes 7–10 % faster than row by row (128 and 512
/// channels), 8×8 within the noise, 32×32 slower (2.1 against 1.4 ms at 16 channels: one long
/// copy between differently aligned addresses loses to many short ones).
const SHIFTED_PLANE_WIDTH: usize = 16;

/// Writes the columns of `images` of `x` (`[N, Cin, H, W]`, contiguous) into `columns`
/// (`[K, images.len(), Ho, Wo]`).
///
/// # Panics
///
/// If `columns` does not have `K · images.len() · Ho · Wo` elements or `x` is too short for
/// `images`.
pub(crate) fn im2col(x: &[f32], dims: &ConvDims, images: Range<usize>, columns: &mut [f32]) {
    let count = images.len();
    let positions = dims.positions();
    assert_eq!(columns.len(), dims.rows() * count * positions);
    assert!(x.len() >= images.end * dims.image_len());
    let [height, width] = dims.input;
    let [out_h, out_w] = dims.output;
    let stride_w = dims.geometry.stride[1];
    if stride_w > 1 {
        im2col_strided(x, dims, images, columns);
        return;
    }
    let shifted = dims.geometry.stride == [1, 1] && out_w == width && width < SHIFTED_PLANE_WIDTH;
    columns
        .par_chunks_mut(count * positions)
        .enumerate()
        .for_each(|(row, dst)| {
            let (channel, i, j) = dims.tap(row);
            if shifted {
                let Some(copy) = ShiftedCopy::new(dims, i, j) else {
                    dst.fill(0.0);
                    return;
                };
                for (slot, image) in images.clone().enumerate() {
                    let plane =
                        &x[(image * dims.channels + channel) * height * width..][..height * width];
                    copy.write(plane, &mut dst[slot * positions..][..positions]);
                }
                return;
            }
            let valid = dims.valid_columns(j);
            // Source column of output column `valid.start`.
            let first = (valid.start + j * dims.geometry.dilation[1])
                .wrapping_sub(dims.geometry.padding[1].0);
            for (slot, image) in images.clone().enumerate() {
                let plane =
                    &x[(image * dims.channels + channel) * height * width..][..height * width];
                for out_row in 0..out_h {
                    let line = &mut dst[(slot * out_h + out_row) * out_w..][..out_w];
                    let Some(src_row) = dims.source(0, out_row, i).filter(|_| !valid.is_empty())
                    else {
                        line.fill(0.0);
                        continue;
                    };
                    line[..valid.start].fill(0.0);
                    line[valid.end..].fill(0.0);
                    let src = &plane[src_row * width..][..width];
                    let inside = &mut line[valid.clone()];
                    inside.copy_from_slice(&src[first..first + inside.len()]);
                }
            }
        });
}

/// One column-matrix row (kernel tap (`i`, `j`)) of one image as a single copy, when the
/// stride is 1 and the output is as wide as the input: output row `r` reads input row
/// `r + off_r` shifted by `off_c` columns, so the whole image is one contiguous copy, and only
/// the columns the shift wrapped around need zeros (one per row for a 3×3 kernel with padding
/// 1). For narrow images, where a row is a few elements, the calls per row cost more than the
/// bytes ([`SHIFTED_PLANE_WIDTH`]). The plan depends on the tap only, so it is made once for
/// all the images of a row.
struct ShiftedCopy {
    /// Output rows that read inside the input (the others are zero).
    rows: Range<usize>,
    /// Output columns that read inside the input, in every such row.
    valid: Range<usize>,
    /// The part of the output copied, and where it starts in the input plane.
    copied: Range<usize>,
    from: usize,
    width: usize,
}

impl ShiftedCopy {
    /// The copy of tap (`i`, `j`); `None` when it reads only padding.
    fn new(dims: &ConvDims, i: usize, j: usize) -> Option<Self> {
        let [height, width] = dims.input;
        let g = &dims.geometry;
        let inside = |r: &usize| dims.source(0, *r, i).is_some();
        let first = (0..dims.output[0]).find(inside)?;
        let last = (0..dims.output[0]).rev().find(inside)?;
        let valid = dims.valid_columns(j);
        if valid.is_empty() {
            return None;
        }
        let off_r = (i * g.dilation[0]) as isize - g.padding[0].0 as isize;
        let off_c = (j * g.dilation[1]) as isize - g.padding[1].0 as isize;
        let shift = off_r * width as isize + off_c;
        let (lo, hi) = (first * width, (last + 1) * width);
        // Clip to the source plane: the first and last element may wrap outside it.
        let copy_lo = (lo as isize).max(-shift) as usize;
        let copy_hi = ((hi as isize).min((height * width) as isize - shift) as usize).max(copy_lo);
        Some(Self {
            rows: first..last + 1,
            valid,
            copied: copy_lo..copy_hi,
            from: (copy_lo as isize + shift) as usize,
            width,
        })
    }

    /// Writes the row of the image whose input channel plane is `plane` into `dst` (`Ho·Wo`).
    fn write(&self, plane: &[f32], dst: &mut [f32]) {
        let Range { start, end } = self.copied.clone();
        dst[..start].fill(0.0);
        dst[end..].fill(0.0);
        dst[start..end].copy_from_slice(&plane[self.from..self.from + (end - start)]);
        for r in self.rows.clone() {
            let line = &mut dst[r * self.width..][..self.width];
            line[..self.valid.start].fill(0.0);
            line[self.valid.end..].fill(0.0);
        }
    }
}

/// Adds `columns` (`[K, images.len(), Ho, Wo]`, the gradient of the column matrix) back into
/// `dx`, the input gradient of `images` (`[images.len(), Cin, H, W]`, contiguous).
///
/// # Panics
///
/// If a slice's length does not match `dims` and `images`.
pub(crate) fn col2im(columns: &[f32], dims: &ConvDims, images: Range<usize>, dx: &mut [f32]) {
    let count = images.len();
    let positions = dims.positions();
    assert_eq!(columns.len(), dims.rows() * count * positions);
    assert_eq!(dx.len(), count * dims.image_len());
    let [height, width] = dims.input;
    let [kh, kw] = dims.kernel;
    let [out_h, out_w] = dims.output;
    let stride_w = dims.geometry.stride[1];
    dx.par_chunks_mut(height * width)
        .enumerate()
        .for_each(|(plane_index, plane)| {
            let (slot, channel) = (plane_index / dims.channels, plane_index % dims.channels);
            for i in 0..kh {
                for j in 0..kw {
                    let row = (channel * kh + i) * kw + j;
                    let src = &columns[(row * count + slot) * positions..][..positions];
                    let valid = dims.valid_columns(j);
                    let first = (valid.start * stride_w + j * dims.geometry.dilation[1])
                        .wrapping_sub(dims.geometry.padding[1].0);
                    for out_row in 0..out_h {
                        let Some(dst_row) = dims.source(0, out_row, i) else {
                            continue;
                        };
                        let line = &src[out_row * out_w..][valid.clone()];
                        let dst = &mut plane[dst_row * width..][..width];
                        for (k, value) in line.iter().enumerate() {
                            dst[first + k * stride_w] += value;
                        }
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::{ConvDims, col2im, im2col};
    use crate::conv::geometry::ConvGeometry;
    use crate::test_support::conv_dims as dims;

    /// Column matrix by the definition, one element at a time.
    fn naive_im2col(x: &[f32], dims: &ConvDims, images: std::ops::Range<usize>) -> Vec<f32> {
        let [h, w] = dims.input;
        let [kh, kw] = dims.kernel;
        let [oh, ow] = dims.output;
        let g = dims.geometry;
        let count = images.len();
        let mut out = vec![0.0; dims.rows() * count * oh * ow];
        for c in 0..dims.channels {
            for i in 0..kh {
                for j in 0..kw {
                    let row = (c * kh + i) * kw + j;
                    for (slot, n) in images.clone().enumerate() {
                        for y in 0..oh {
                            for x_ in 0..ow {
                                let sy = (y * g.stride[0] + i * g.dilation[0]) as isize
                                    - g.padding[0].0 as isize;
                                let sx = (x_ * g.stride[1] + j * g.dilation[1]) as isize
                                    - g.padding[1].0 as isize;
                                let inside =
                                    sy >= 0 && sx >= 0 && (sy as usize) < h && (sx as usize) < w;
                                let value = if inside {
                                    x[((n * dims.channels + c) * h + sy as usize) * w + sx as usize]
                                } else {
                                    0.0
                                };
                                out[((row * count + slot) * oh + y) * ow + x_] = value;
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn cases() -> Vec<ConvDims> {
        let g = ConvGeometry::new;
        vec![
            dims(3, [7, 6], [3, 3], g().with_padding([(1, 1), (1, 1)])),
            dims(
                2,
                [8, 9],
                [3, 3],
                g().with_stride([2, 2]).with_padding([(1, 1), (1, 1)]),
            ),
            dims(4, [5, 5], [1, 1], g().with_stride([2, 2])),
            dims(
                2,
                [9, 7],
                [3, 2],
                g().with_dilation([2, 1]).with_padding([(0, 2), (1, 0)]),
            ),
            dims(
                1,
                [6, 11],
                [2, 5],
                g().with_stride([1, 3]).with_padding([(3, 0), (0, 4)]),
            ),
            // Unit stride and an output as wide as the input: each row is one shifted copy
            // of the plane, with the wrapped-around columns zeroed.
            dims(3, [4, 5], [1, 1], g()),
            // Strided along the width (column phases): dilated taps, padding wider than a
            // stride, odd widths, a stride wider than the kernel.
            dims(
                2,
                [9, 11],
                [3, 3],
                g().with_stride([2, 2])
                    .with_dilation([1, 2])
                    .with_padding([(1, 1), (3, 0)]),
            ),
            dims(
                3,
                [5, 7],
                [2, 2],
                g().with_stride([1, 4]).with_padding([(0, 1), (1, 2)]),
            ),
            dims(
                2,
                [3, 3],
                [3, 3],
                g().with_stride([3, 2]).with_padding([(1, 1), (1, 1)]),
            ),
            dims(2, [4, 4], [5, 5], g().with_padding([(2, 2), (2, 2)])),
            dims(2, [5, 6], [3, 3], g().with_padding([(2, 0), (0, 2)])),
            dims(
                1,
                [4, 4],
                [3, 3],
                g().with_dilation([3, 3]).with_padding([(3, 3), (3, 3)]),
            ),
        ]
    }

    fn input(len: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 37 % 101) as f32) - 50.0).collect()
    }

    #[test]
    fn im2col_matches_the_definition() {
        for d in cases() {
            let x = input(3 * d.image_len());
            let images = 1..3;
            let mut columns = vec![f32::NAN; d.rows() * 2 * d.positions()];
            im2col(&x, &d, images.clone(), &mut columns);
            assert_eq!(columns, naive_im2col(&x, &d, images), "{d:?}");
        }
    }

    /// col2im is im2col's adjoint: <im2col(x), c> = <x, col2im(c)> for any x and c, exactly
    /// in integers (the inputs are small whole numbers, so every sum is exact in f32).
    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        for d in cases() {
            let count = 2;
            let x = input(count * d.image_len());
            let c: Vec<f32> = (0..d.rows() * count * d.positions())
                .map(|i| ((i * 13 % 7) as f32) - 3.0)
                .collect();
            let mut columns = vec![0.0; c.len()];
            im2col(&x, &d, 0..count, &mut columns);
            let mut dx = vec![0.0; x.len()];
            col2im(&c, &d, 0..count, &mut dx);
            let lhs: f64 = columns.iter().zip(&c).map(|(a, b)| (a * b) as f64).sum();
            let rhs: f64 = x.iter().zip(&dx).map(|(a, b)| (a * b) as f64).sum();
            assert_eq!(lhs, rhs, "{d:?}");
        }
    }
}
