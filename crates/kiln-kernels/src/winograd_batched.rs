//! Winograd F(2×2, 3×3)'s data transforms for small images, vectorized across the images of
//! a block instead of along a row of tiles.
//!
//! [`crate::winograd_tiles`] runs each transform over a plane's runs of tiles; at an 8×8 output
//! a tile row is 4 tiles, so its element-wise operations ran on 4-element slices and the
//! input transform cost a third of the GEMMs' time (64 channels). Here the tiles of a block
//! are ordered tile-major, `t = (tile row · tile columns + tile column) · images + slot`, so
//! every operation runs over the block's images at once (16 or 32 of them at 8×8). The
//! arithmetic of each element is the one `winograd_tiles` does, in the same order; only the
//! tiles' order differs, which the GEMMs do not see except as the order of the weight
//! gradient's sum over tiles (fixed by the shapes, like every other order here).

use std::ops::Range;

use rayon::prelude::*;

use crate::im2col::ConvDims;
use crate::simd::simd;
use crate::winograd_tiles::{Tiling, add, channel_stride, sub};

/// Whether a block of `images` images of `tiling` takes these transforms: tile rows too short
/// for `winograd_tiles`' runs and enough images to fill a vector.
pub(crate) fn applies(tiling: Tiling, images: usize) -> bool {
    tiling.cols < 8 && images >= 8
}

/// `Bᵀ` of a column (or row) of 4 vectors `d`: `d0 − d2, d1 + d2, d2 − d1, d1 − d3`.
#[inline(always)]
fn input_1d(out: [&mut [f32]; 4], d: [&[f32]; 4]) {
    let [p0, p1, p2, p3] = out;
    sub(p0, d[0], d[2]);
    add(p1, d[1], d[2]);
    sub(p2, d[2], d[1]);
    sub(p3, d[1], d[3]);
}

/// Transformed input tiles of `images` of `x` (`[N, Cin, H, W]`) into `v` (`[Cin, 16,
/// tiles]`, tile-major order), one channel per task: the channel's planes gathered into a
/// zero-padded `[y, x, image]` block, then per tile row `Bᵀ` down the columns and per tile
/// `Bᵀ` along the rows, each over all the images.
pub(crate) fn transform_input(
    x: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    images: Range<usize>,
    v: &mut [f32],
) {
    let [h, w] = dims.input;
    let n = images.len();
    let tiles = n * tiling.per_image();
    let (top, left) = (dims.geometry.padding[0].0, dims.geometry.padding[1].0);
    let (rows, cols) = (tiling.rows, tiling.cols);
    let (padded_h, padded_w) = (2 * rows + 2, 2 * cols + 2);
    v.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; (padded_h + 4) * padded_w * n],
            |scratch, (channel, out)| {
                simd(
                    #[inline(always)]
                    || {
                        let (gathered, vertical) = scratch.split_at_mut(padded_h * padded_w * n);
                        gathered.fill(0.0);
                        for (slot, image) in images.clone().enumerate() {
                            let plane = &x[(image * dims.channels + channel) * h * w..][..h * w];
                            for (y, row) in plane.chunks_exact(w).enumerate() {
                                let base = ((y + top) * padded_w + left) * n + slot;
                                // The padded block holds every input column (2·cols + 2 ≥
                                // left + W for any padding a 3×3 output of this size allows).
                                for (col, value) in row.iter().enumerate() {
                                    gathered[base + col * n] = *value;
                                }
                            }
                        }
                        let at = |y: usize, x: usize| &gathered[(y * padded_w + x) * n..][..n];
                        for a in 0..rows {
                            // vertical[i][x]: Bᵀ down padded column x of tile row a.
                            for col in 0..padded_w {
                                let d = std::array::from_fn(|r| at(2 * a + r, col));
                                let mut parts = vertical.chunks_exact_mut(padded_w * n);
                                let out = std::array::from_fn(|_| {
                                    &mut parts.next().expect("4 rows")[col * n..][..n]
                                });
                                input_1d(out, d);
                            }
                            for b in 0..cols {
                                let t0 = (a * cols + b) * n;
                                for i in 0..4 {
                                    let row = &vertical[i * padded_w * n..][..padded_w * n];
                                    let d = std::array::from_fn(|c| &row[(2 * b + c) * n..][..n]);
                                    let mut points = out.chunks_exact_mut(tiles).skip(4 * i);
                                    let out = std::array::from_fn(|_| {
                                        &mut points.next().expect("16 points")[t0..][..n]
                                    });
                                    input_1d(out, d);
                                }
                            }
                        }
                    },
                )
            },
        );
}

/// Output tiles `Aᵀ M A` of `m` (`[16, Cout, tiles]`, tile-major order) into `out`
/// (`[images, Cout, Ho, Wo]`), one output channel per task, each tile over all the images.
pub(crate) fn transform_output(
    m: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    out_channels: usize,
    tiles: usize,
    out: &mut [f32],
) {
    let [out_h, out_w] = dims.output;
    let plane_len = out_h * out_w;
    let n = tiles / tiling.per_image();
    let stride = out_channels * tiles;
    let (rows, cols) = (tiling.rows, tiling.cols);
    // The planes of each output channel, one per image.
    let mut by_channel: Vec<Vec<&mut [f32]>> = (0..out_channels).map(|_| Vec::new()).collect();
    for (index, plane) in out.chunks_exact_mut(plane_len).enumerate() {
        by_channel[index % out_channels].push(plane);
    }
    by_channel.into_par_iter().enumerate().for_each_init(
        || vec![0.0f32; 12 * n],
        |scratch, (channel, mut planes)| {
            simd(
                #[inline(always)]
                || {
                    let (columns, results) = scratch.split_at_mut(8 * n);
                    for a in 0..rows {
                        for b in 0..cols {
                            let t0 = (a * cols + b) * n;
                            let point = |p: usize| &m[p * stride + channel * tiles + t0..][..n];
                            // c[2j + r]: row r of Aᵀ M, column j.
                            for (j, pair) in columns.chunks_exact_mut(2 * n).enumerate() {
                                let (c0, c1) = pair.split_at_mut(n);
                                for (((((d0, d1), p0), p1), p2), p3) in c0
                                    .iter_mut()
                                    .zip(c1.iter_mut())
                                    .zip(point(j))
                                    .zip(point(4 + j))
                                    .zip(point(8 + j))
                                    .zip(point(12 + j))
                                {
                                    *d0 = p0 + p1 + p2;
                                    *d1 = p1 - p2 - p3;
                                }
                            }
                            let c = |j: usize, r: usize| &columns[(2 * j + r) * n..][..n];
                            for (r, pair) in results.chunks_exact_mut(2 * n).enumerate() {
                                let (y0, y1) = pair.split_at_mut(n);
                                for (((((e, o), c0), c1), c2), c3) in y0
                                    .iter_mut()
                                    .zip(y1.iter_mut())
                                    .zip(c(0, r))
                                    .zip(c(1, r))
                                    .zip(c(2, r))
                                    .zip(c(3, r))
                                {
                                    *e = c0 + c1 + c2;
                                    *o = c1 - c2 - c3;
                                }
                                let out_row = 2 * a + r;
                                if out_row >= out_h {
                                    continue;
                                }
                                let at = out_row * out_w + 2 * b;
                                for (plane, (e, o)) in planes.iter_mut().zip(y0.iter().zip(&*y1)) {
                                    plane[at] = *e;
                                    if 2 * b + 1 < out_w {
                                        plane[at + 1] = *o;
                                    }
                                }
                            }
                        }
                    }
                },
            )
        },
    );
}

/// Transformed output-gradient tiles `A dY Aᵀ` of `images` of `grad` (`[N, Cout, Ho, Wo]`)
/// into `dm` (`[Cout, 16, tiles]`, tile-major order), one channel per task: the channel's
/// planes gathered into a `[y, x, image]` block (zero past the output's edge), then per tile
/// `A` down the columns and along the rows over all the images.
pub(crate) fn transform_output_grad(
    grad: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    out_channels: usize,
    images: Range<usize>,
    dm: &mut [f32],
) {
    let [out_h, out_w] = dims.output;
    let n = images.len();
    let tiles = n * tiling.per_image();
    let (rows, cols) = (tiling.rows, tiling.cols);
    let (tiled_h, tiled_w) = (2 * rows, 2 * cols);
    dm.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; (tiled_h * tiled_w + 6) * n],
            |scratch, (channel, out)| {
                simd(
                    #[inline(always)]
                    || {
                        let (gathered, columns) = scratch.split_at_mut(tiled_h * tiled_w * n);
                        gathered.fill(0.0);
                        for (slot, image) in images.clone().enumerate() {
                            let plane = &grad[(image * out_channels + channel) * out_h * out_w..]
                                [..out_h * out_w];
                            for (y, row) in plane.chunks_exact(out_w).enumerate() {
                                for (col, value) in row.iter().enumerate() {
                                    gathered[(y * tiled_w + col) * n + slot] = *value;
                                }
                            }
                        }
                        let at = |y: usize, x: usize| &gathered[(y * tiled_w + x) * n..][..n];
                        for a in 0..rows {
                            for b in 0..cols {
                                let t0 = (a * cols + b) * n;
                                // A down the columns (rows 2a, 2a + 1): v0, v0 + v1, v0 − v1,
                                // −v1, for the tile's even and odd column.
                                let [se, so, de, d_o, ne, no] = {
                                    let mut parts = columns.chunks_exact_mut(n);
                                    std::array::from_fn(|_| parts.next().expect("6 rows"))
                                };
                                let (e0, o0) = (at(2 * a, 2 * b), at(2 * a, 2 * b + 1));
                                let (e1, o1) = (at(2 * a + 1, 2 * b), at(2 * a + 1, 2 * b + 1));
                                add(se, e0, e1);
                                add(so, o0, o1);
                                sub(de, e0, e1);
                                sub(d_o, o0, o1);
                                for (d, v) in ne.iter_mut().zip(e1) {
                                    *d = -v;
                                }
                                for (d, v) in no.iter_mut().zip(o1) {
                                    *d = -v;
                                }
                                let rows_of_a: [(&[f32], &[f32]); 4] =
                                    [(e0, o0), (se, so), (de, d_o), (ne, no)];
                                for (i, (e, o)) in rows_of_a.into_iter().enumerate() {
                                    // A along the rows: e, e + o, e − o, −o.
                                    let mut points = out.chunks_exact_mut(tiles).skip(4 * i);
                                    let [p0, p1, p2, p3]: [&mut [f32]; 4] =
                                        std::array::from_fn(|_| {
                                            &mut points.next().expect("16 points")[t0..][..n]
                                        });
                                    p0.copy_from_slice(e);
                                    add(p1, e, o);
                                    sub(p2, e, o);
                                    for (d, v) in p3.iter_mut().zip(o) {
                                        *d = -v;
                                    }
                                }
                            }
                        }
                    },
                )
            },
        );
}
