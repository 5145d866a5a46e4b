//! Unit-stride convolutions of large images as shifted GEMMs over a padded copy, without
//! im2col.
//!
//! Over a zero-padded image (`Hp × Wp` per channel), output row `r`, column `c` of tap
//! `(i, j)` reads padded element `(r + i·d)·Wp + c + j·d`. Keep `kw` copies of each channel's
//! padded plane, copy `j` shifted left by `j·d` columns: then, for each tap row `i`, the
//! rows `(c, j)` of that buffer read from offset `i·d·Wp` form one strided `[Cin·kw, Ho·Wp]`
//! matrix, and the convolution is `kh` GEMMs `W_i [Cout, Cin·kw] × X_i` accumulating into an
//! output `Wp` columns wide, whose first `Wo` columns are the result (the others mix
//! neighbouring rows and are dropped). The buffer costs `kw` copies of the image where
//! im2col writes `kh·kw`, and gemm's packing reads it directly. The weight gradient is the
//! adjoint, `Σ_images X_i × gY_wideᵀ` per tap row, the dropped columns of `gY_wide` zero so
//! they add nothing. (One GEMM per tap, inner dimension `Cin`, copied less but ran slower:
//! 1.14× im2col's forward at 16 channels where this runs 1.3–1.4×.)
//!
//! Measured against im2col (one thread, AMD EPYC Zen 4, batch 32, 3×3 kernels, padding 1):
//! 16 channels 32×32 (ResNet-18's first stage at width 16) forward 1.3–1.4×, weight gradient
//! 1.3× faster; 32 channels 16×16 1.25–1.35× and 1.0–1.45×; 64 channels 32×32 1.1–1.2× and
//! 1.1× (`shifted_speed`). Images are processed one at a time (each at least
//! [`MIN_POSITIONS`] output positions, a GEMM wide enough on its own); the weight gradient's
//! images are summed in a fixed order (`block_sum`), so results do not depend on threads.

use rayon::prelude::*;

use crate::conv::block_sum::sum_over_blocks;
use crate::conv::dims::ConvDims;
use crate::gemm::{Matrix, matmul};
use crate::short_copy::copy_short;
use crate::zeroed::zeroed;

/// Fewest output positions per image: smaller images would waste more of each GEMM on the
/// dropped columns (`Wp − Wo` per row) and need several images per GEMM.
pub(crate) const MIN_POSITIONS: usize = 256;

/// Fewest input channels, the inner dimension of each tap's GEMM: below it gemm's kernels
/// spend more on loading and storing the output than on multiply-adds.
pub(crate) const MIN_CHANNELS: usize = 8;

/// Whether a convolution of `dims` takes this path: unit stride (any kernel, padding and
/// dilation), at least [`MIN_CHANNELS`] input channels and [`MIN_POSITIONS`] output positions.
pub(crate) fn applies(dims: &ConvDims) -> bool {
    dims.geometry.stride == [1, 1]
        && dims.channels >= MIN_CHANNELS
        && dims.positions() >= MIN_POSITIONS
}

/// The padded image's layout: `kw` copies of each channel's zero-padded plane, copy `j`
/// shifted left by `j·dilation` columns, so that row `(c, j)` of the `[Cin·kw, S]` buffer
/// read from offset `i·dilation·Wp` is tap `(i, j)`'s window on channel `c`.
#[derive(Clone, Copy, Debug)]
struct Padded {
    /// Padded width `Wp`: the output's row length while computing.
    width: usize,
    /// Distance between rows `(c, j)`: the padded plane rounded to a cache line and kept off
    /// multiples of 512 (cache-set aliasing when gemm packs across them).
    row_stride: usize,
}

impl Padded {
    fn new(dims: &ConvDims) -> Self {
        let g = &dims.geometry;
        let height = dims.input[0] + g.padding[0].0 + g.padding[0].1;
        let width = dims.input[1] + g.padding[1].0 + g.padding[1].1;
        let mut row_stride = (height * width).next_multiple_of(16);
        if row_stride.is_multiple_of(512) {
            row_stride += 16;
        }
        Self { width, row_stride }
    }

    /// Rows `(c, j)`: the inner dimension of each tap row's GEMM.
    fn rows(dims: &ConvDims) -> usize {
        dims.channels * dims.kernel[1]
    }

    /// Where tap row `i`'s window starts.
    fn offset(&self, dims: &ConvDims, i: usize) -> usize {
        i * dims.geometry.dilation[0] * self.width
    }

    /// Output elements per channel while computing: `Ho · Wp`.
    fn wide(&self, dims: &ConvDims) -> usize {
        dims.output[0] * self.width
    }

    /// Writes `image` (`[Cin, H, W]`) into `padded`, whose zeros are never written (a buffer
    /// zeroed once serves every image of the convolution).
    fn fill(&self, dims: &ConvDims, image: &[f32], padded: &mut Vec<f32>) {
        let len = Self::rows(dims) * self.row_stride;
        if padded.len() != len {
            padded.clear();
            padded.resize(len, 0.0);
        }
        let [height, width] = dims.input;
        let (top, left) = (dims.geometry.padding[0].0, dims.geometry.padding[1].0);
        let kw = dims.kernel[1];
        for (channel, plane) in image.chunks_exact(height * width).enumerate() {
            for j in 0..kw {
                // Input column `x` lands at padded column `left + x`, here `j·d` further left;
                // columns left of 0 are read by no kept output.
                let shift = j * dims.geometry.dilation[1];
                let skip = shift.saturating_sub(left);
                let at = left.saturating_sub(shift);
                let count = width.saturating_sub(skip).min(self.width - at);
                if count == 0 {
                    // The whole image lies left of this copy (a dilated tap on a narrow
                    // image): all zeros.
                    continue;
                }
                let dst = &mut padded[(channel * kw + j) * self.row_stride..];
                for (row, line) in plane.chunks_exact(width).enumerate() {
                    copy_short(
                        &mut dst[(top + row) * self.width + at..][..count],
                        &line[skip..skip + count],
                    );
                }
            }
        }
    }

    /// A tap row's window as a `[Cin·kw, Ho·Wp]` matrix.
    fn window(&self, dims: &ConvDims) -> Matrix {
        Matrix {
            rows: Self::rows(dims),
            cols: self.wide(dims),
            row_stride: self.row_stride,
            col_stride: 1,
        }
    }
}

/// `weight` `[Cout, Cin, kh, kw]` as `kh` row-major `[Cout, Cin·kw]` matrices, one per tap
/// row.
fn weight_by_tap_row(weight: &[f32], dims: &ConvDims, out_channels: usize) -> Vec<f32> {
    let [kh, kw] = dims.kernel;
    let per_row = out_channels * dims.channels * kw;
    let mut rows = vec![0.0f32; kh * per_row];
    for (index, kernel) in weight.chunks_exact(kh * kw).enumerate() {
        for (i, taps) in kernel.chunks_exact(kw).enumerate() {
            rows[i * per_row + index * kw..][..kw].copy_from_slice(taps);
        }
    }
    rows
}

/// `x` `[N, Cin, H, W]` convolved with `weight` `[Cout, Cin, kh, kw]`: `[N, Cout, Ho, Wo]`.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let layout = Padded::new(dims);
    let out_w = dims.output[1];
    let positions = dims.positions();
    let wide = layout.wide(dims);
    let inner = Padded::rows(dims);
    let by_row = weight_by_tap_row(weight, dims, out_channels);
    let mut output = zeroed(batch * out_channels * positions);
    output
        .par_chunks_mut(out_channels * positions)
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new()),
            |(padded, product), (image, out)| {
                layout.fill(
                    dims,
                    &x[image * dims.image_len()..][..dims.image_len()],
                    padded,
                );
                product.resize(out_channels * wide, 0.0);
                for i in 0..dims.kernel[0] {
                    matmul(
                        product,
                        i > 0,
                        (
                            &by_row[i * out_channels * inner..],
                            Matrix::row_major(out_channels, inner),
                        ),
                        (&padded[layout.offset(dims, i)..], layout.window(dims)),
                    );
                }
                for (dst, src) in out
                    .chunks_exact_mut(out_w)
                    .zip(product.chunks_exact(layout.width))
                {
                    dst.copy_from_slice(&src[..out_w]);
                }
            },
        );
    output
}

/// The weight gradient `[Cout, Cin, kh, kw]` of `forward(x, weight)` given the output
/// gradient `grad` `[N, Cout, Ho, Wo]`.
pub(crate) fn weight_gradient(
    x: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let layout = Padded::new(dims);
    let [kh, kw] = dims.kernel;
    let out_w = dims.output[1];
    let positions = dims.positions();
    let wide = layout.wide(dims);
    let per_row = out_channels * Padded::rows(dims);
    // [kh, Cin·kw, Cout], summed over the images in a fixed order.
    let total = sum_over_blocks(
        batch,
        kh * per_row,
        || (Vec::new(), Vec::new()),
        |partial, accumulate, image, (padded, grad_wide): &mut (Vec<f32>, Vec<f32>)| {
            layout.fill(
                dims,
                &x[image * dims.image_len()..][..dims.image_len()],
                padded,
            );
            // The output gradient, `Wp` columns wide; the extra columns stay zero.
            if grad_wide.len() != out_channels * wide {
                grad_wide.clear();
                grad_wide.resize(out_channels * wide, 0.0);
            }
            let image_grad = &grad[image * out_channels * positions..][..out_channels * positions];
            for (dst, src) in grad_wide
                .chunks_exact_mut(layout.width)
                .zip(image_grad.chunks_exact(out_w))
            {
                dst[..out_w].copy_from_slice(src);
            }
            // Transposed, `X_row × gY_wideᵀ` (`[Cin·kw, Cout]`): gemm repacks one operand of a
            // product summed along contiguous rows, and this way it is the smaller one.
            let upstream = (
                &grad_wide[..],
                Matrix::row_major(out_channels, wide).transposed(),
            );
            for i in 0..kh {
                matmul(
                    &mut partial[i * per_row..][..per_row],
                    accumulate,
                    (&padded[layout.offset(dims, i)..], layout.window(dims)),
                    upstream,
                );
            }
        },
    );
    // [kh, Cin, kw, Cout] -> [Cout, Cin, kh, kw]
    let mut weight_grad = vec![0.0f32; total.len()];
    for (i, row) in total.chunks_exact(per_row).enumerate() {
        for (k, outputs) in row.chunks_exact(out_channels).enumerate() {
            let (c, j) = (k / kw, k % kw);
            for (o, value) in outputs.iter().enumerate() {
                weight_grad[((o * dims.channels + c) * kh + i) * kw + j] = *value;
            }
        }
    }
    weight_grad
}
