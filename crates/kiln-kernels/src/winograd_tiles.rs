//! The data transforms of Winograd F(2×2, 3×3), one row of tiles at a time.
//!
//! Every transform works on a whole row of tiles at once, with the tiles along the innermost,
//! unit-stride dimension (even and odd columns split apart first), so each step is an
//! element-wise operation on slices that the compiler turns into SIMD, and each of the 16
//! points of a row of tiles is written as one contiguous run. Transformed tiles are laid out
//! `[channel, 16 points, tiles]`, tile `t` = (image slot · tile rows + tile row) · tile
//! columns + tile column.

use std::ops::Range;

use rayon::prelude::*;

use crate::im2col::ConvDims;

/// Points of a transformed 4×4 tile.
pub(crate) const POINTS: usize = 16;

/// Distance between channels in a transformed layout, in elements: the 16 points' runs of
/// tiles, plus one cache line. GEMMs read these operands across channels, and with a
/// power-of-two distance every channel's element falls into the same cache sets (gemm's
/// packing of the weight gradient's operands took about 3 ns per element that way).
pub(crate) fn channel_stride(tiles: usize) -> usize {
    POINTS * tiles + 16
}

/// How a convolution's output is cut into 2×2 tiles (the last row or column of tiles may
/// reach one past the output; those outputs are dropped, and their gradients are zero).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tiling {
    /// Tile rows per image.
    pub rows: usize,
    /// Tile columns per image.
    pub cols: usize,
}

impl Tiling {
    /// The tiles of `dims`' output.
    pub fn new(dims: &ConvDims) -> Self {
        Self {
            rows: dims.output[0].div_ceil(2),
            cols: dims.output[1].div_ceil(2),
        }
    }

    /// Tiles per image.
    pub fn per_image(self) -> usize {
        self.rows * self.cols
    }
}

fn sub(dst: &mut [f32], a: &[f32], b: &[f32]) {
    for ((d, a), b) in dst.iter_mut().zip(a).zip(b) {
        *d = a - b;
    }
}

fn add(dst: &mut [f32], a: &[f32], b: &[f32]) {
    for ((d, a), b) in dst.iter_mut().zip(a).zip(b) {
        *d = a + b;
    }
}

/// `dst = a + b + c`.
fn add3(dst: &mut [f32], a: &[f32], b: &[f32], c: &[f32]) {
    for (((d, a), b), c) in dst.iter_mut().zip(a).zip(b).zip(c) {
        *d = a + b + c;
    }
}

/// `dst = a − b − c`.
fn sub2(dst: &mut [f32], a: &[f32], b: &[f32], c: &[f32]) {
    for (((d, a), b), c) in dst.iter_mut().zip(a).zip(b).zip(c) {
        *d = a - b - c;
    }
}

/// `Bᵀ` along one dimension for `n` tiles at once: `d[k]` holds the k-th input of each tile,
/// `out[k]` receives the k-th output.
fn input_1d(out: [&mut [f32]; 4], d: [&[f32]; 4]) {
    let [o0, o1, o2, o3] = out;
    sub(o0, d[0], d[2]);
    add(o1, d[1], d[2]);
    sub(o2, d[2], d[1]);
    sub(o3, d[1], d[3]);
}

/// Splits `scratch` into `N` slices of `len`.
fn slices<const N: usize>(scratch: &mut [f32], len: usize) -> [&mut [f32]; N] {
    let mut rest = &mut scratch[..N * len];
    std::array::from_fn(|_| {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        rest = tail;
        head
    })
}

/// Transformed input tiles `Bᵀ d B` of `images` of `x` (`[N, Cin, H, W]`) into `v`
/// (`[Cin, 16, tiles]`, channels [`channel_stride`] apart), one channel per task.
pub(crate) fn transform_input(
    x: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    images: Range<usize>,
    v: &mut [f32],
) {
    let [h, w] = dims.input;
    let tiles = images.len() * tiling.per_image();
    let (top, left) = (dims.geometry.padding[0].0, dims.geometry.padding[1].0);
    let cols = tiling.cols;
    // A padded input row holds the 2·cols + 2 columns the row of tiles reads.
    let span = 2 * cols + 2;
    v.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; span + 24 * (cols + 1)],
            |scratch, (channel, out)| {
                let (line, rest) = scratch.split_at_mut(span);
                // even/odd columns of the 4 rows, then the 4 rows' horizontal transforms.
                let (split, rest) = rest.split_at_mut(8 * (cols + 1));
                let horizontal = &mut rest[..16 * cols];
                for (slot, image) in images.clone().enumerate() {
                    let plane = &x[(image * dims.channels + channel) * h * w..][..h * w];
                    for a in 0..tiling.rows {
                        for r in 0..4 {
                            // Input row of tile-row a's r-th row, if inside the image.
                            let y = (2 * a + r).checked_sub(top).filter(|&y| y < h);
                            line.fill(0.0);
                            if let Some(y) = y {
                                // Column k of `line` is input column k − left.
                                let start = left.min(span);
                                let count = w.min(span - start);
                                line[start..start + count]
                                    .copy_from_slice(&plane[y * w..][..count]);
                            }
                            let (even, odd) = split[2 * r * (cols + 1)..][..2 * (cols + 1)]
                                .split_at_mut(cols + 1);
                            for k in 0..=cols {
                                even[k] = line[2 * k];
                                odd[k] = line[2 * k + 1];
                            }
                        }
                        for r in 0..4 {
                            let even = &split[2 * r * (cols + 1)..][..cols + 1];
                            let odd = &split[(2 * r + 1) * (cols + 1)..][..cols + 1];
                            let out = slices::<4>(&mut horizontal[4 * r * cols..], cols);
                            input_1d(out, [&even[..cols], &odd[..cols], &even[1..], &odd[1..]]);
                        }
                        let t0 = (slot * tiling.rows + a) * cols;
                        for j in 0..4 {
                            let row = |r: usize| &horizontal[(4 * r + j) * cols..][..cols];
                            let [p0, p1, p2, p3] = points(out, tiles, [j, 4], t0, cols);
                            input_1d([p0, p1, p2, p3], [row(0), row(1), row(2), row(3)]);
                        }
                    }
                }
            },
        );
}

/// The runs of points `first`, `first + step`, `first + 2·step`, `first + 3·step` for tiles
/// `t0..t0 + n` in `out` (`[16, tiles]`).
fn points(
    out: &mut [f32],
    tiles: usize,
    [first, step]: [usize; 2],
    t0: usize,
    n: usize,
) -> [&mut [f32]; 4] {
    let mut rest = out;
    let mut taken = 0;
    std::array::from_fn(|i| {
        let start = (first + i * step) * tiles + t0;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - taken);
        let (run, tail) = tail.split_at_mut(n);
        taken = start + n;
        rest = tail;
        run
    })
}

/// Output tiles `Aᵀ M A` of `m` (`[16, Cout, tiles]`) into `out` (`[images, Cout, Ho, Wo]`),
/// one output plane per task.
pub(crate) fn transform_output(
    m: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    out_channels: usize,
    tiles: usize,
    out: &mut [f32],
) {
    let [out_h, out_w] = dims.output;
    let stride = out_channels * tiles;
    let cols = tiling.cols;
    out.par_chunks_mut(out_h * out_w).enumerate().for_each_init(
        || vec![0.0f32; 12 * cols],
        |scratch, (index, plane)| {
            let (slot, channel) = (index / out_channels, index % out_channels);
            let m = &m[channel * tiles..];
            let (columns, rows) = scratch.split_at_mut(8 * cols);
            for a in 0..tiling.rows {
                let t0 = (slot * tiling.rows + a) * cols;
                let point = |i: usize, j: usize| &m[(4 * i + j) * stride + t0..][..cols];
                // Aᵀ down each column: rows 0 and 1 of the 2×4 intermediate.
                for j in 0..4 {
                    let [c0, c1] = slices::<2>(&mut columns[2 * j * cols..], cols);
                    add3(c0, point(0, j), point(1, j), point(2, j));
                    sub2(c1, point(1, j), point(2, j), point(3, j));
                }
                for r in 0..2.min(out_h - 2 * a) {
                    let c = |j: usize| &columns[(2 * j + r) * cols..][..cols];
                    let [y0, y1] = slices::<2>(rows, cols);
                    add3(y0, c(0), c(1), c(2));
                    sub2(y1, c(1), c(2), c(3));
                    let line = &mut plane[(2 * a + r) * out_w..][..out_w];
                    for b in 0..out_w / 2 {
                        line[2 * b] = y0[b];
                        line[2 * b + 1] = y1[b];
                    }
                    if out_w % 2 == 1 {
                        line[out_w - 1] = y0[cols - 1];
                    }
                }
            }
        },
    );
}

/// Transformed output-gradient tiles `A dY Aᵀ` of `images` of `grad` (`[N, Cout, Ho, Wo]`)
/// into `dm` (`[Cout, 16, tiles]`, channels
/// [`channel_stride`] apart), one channel per task.
pub(crate) fn transform_output_grad(
    grad: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    out_channels: usize,
    images: Range<usize>,
    dm: &mut [f32],
) {
    let [out_h, out_w] = dims.output;
    let tiles = images.len() * tiling.per_image();
    let cols = tiling.cols;
    dm.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; 12 * cols],
            |scratch, (channel, out)| {
                let (split, rows) = scratch.split_at_mut(4 * cols);
                for (slot, image) in images.clone().enumerate() {
                    let plane =
                        &grad[(image * out_channels + channel) * out_h * out_w..][..out_h * out_w];
                    for a in 0..tiling.rows {
                        // even and odd columns of the tile row's two output rows (zero past the
                        // output's edge).
                        split.fill(0.0);
                        for r in 0..2.min(out_h - 2 * a) {
                            let line = &plane[(2 * a + r) * out_w..][..out_w];
                            let (even, odd) = split[2 * r * cols..][..2 * cols].split_at_mut(cols);
                            for b in 0..out_w / 2 {
                                even[b] = line[2 * b];
                                odd[b] = line[2 * b + 1];
                            }
                            if out_w % 2 == 1 {
                                even[cols - 1] = line[out_w - 1];
                            }
                        }
                        let (e0, rest) = split.split_at(cols);
                        let (o0, rest) = rest.split_at(cols);
                        let (e1, o1) = rest.split_at(cols);
                        // A down each column: [v0, v0 + v1, v0 − v1, −v1], for even and odd.
                        let [se, so, de, d_o] = slices::<4>(rows, cols);
                        add(se, e0, e1);
                        add(so, o0, o1);
                        sub(de, e0, e1);
                        sub(d_o, o0, o1);
                        let column: [(&[f32], &[f32], f32); 4] =
                            [(e0, o0, 1.0), (se, so, 1.0), (de, d_o, 1.0), (e1, o1, -1.0)];
                        let t0 = (slot * tiling.rows + a) * cols;
                        for (i, (even, odd, sign)) in column.into_iter().enumerate() {
                            // A along the row: [e, e + o, e − o, −o], times the column's sign.
                            let [p0, p1, p2, p3] = points(out, tiles, [4 * i, 1], t0, cols);
                            for b in 0..cols {
                                let (e, o) = (sign * even[b], sign * odd[b]);
                                p0[b] = e;
                                p1[b] = e + o;
                                p2[b] = e - o;
                                p3[b] = -o;
                            }
                        }
                    }
                }
            },
        );
}
