//! Winograd F(4×4, 3×3)'s data transforms for images of 4 to 7 tile columns, vectorized
//! across the images of a block instead of along a plane's tiles.
//!
//! At a 16×16 output a plane is 4×4 tiles, and [`crate::winograd4_tiles`]' runs over a plane
//! are a vector and a quarter long: its input transform took 1.6× the GEMMs' time (128
//! channels, one thread). Here, as in [`crate::winograd_batched`] for F(2×2, 3×3), the tiles
//! of a block are ordered tile-major, `t = (tile row · tile columns + tile column) · images +
//! slot`, and every step runs over the block's images at once. The arithmetic of each
//! element is `winograd4_tiles`' (`input_1d`, `output_1d`), in the same order.

use std::ops::Range;

use rayon::prelude::*;

use crate::im2col::ConvDims;
use crate::simd::simd;
use crate::winograd4_tiles::{LANES, Tiling, channel_stride, input_1d, output_1d};

/// Whether a block of `images` images of `tiling` takes these transforms: tile rows shorter
/// than a vector's worth of runs in `winograd4_tiles` and a whole vector of images.
pub(crate) fn applies(tiling: Tiling, images: usize) -> bool {
    tiling.cols < 8 && images >= LANES
}

/// Transformed input tiles `Bᵀ d B` of `images` of `x` (`[N, Cin, H, W]`) into `v` (`[Cin, 36,
/// tiles]`, tile-major order), one channel per task: the channel's planes gathered into a
/// zero-padded `[y, x, image]` block, then per tile row `Bᵀ` down every padded column and per
/// tile `Bᵀ` along the rows, each over all the images.
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
    // Rows and columns the tiles read, 4 · tiles + 2; the block holds every input element,
    // since padding + H ≤ Ho + 2 ≤ 4 · rows + 2 (and the same across).
    let (padded_h, padded_w) = (4 * rows + 2, 4 * cols + 2);
    v.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; (padded_h + 6) * padded_w * n],
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
                                for (col, value) in row.iter().enumerate() {
                                    gathered[base + col * n] = *value;
                                }
                            }
                        }
                        let at = |y: usize, x: usize| &gathered[(y * padded_w + x) * n..][..n];
                        for a in 0..rows {
                            // vertical[k]: row k of Bᵀ d down each padded column of tile row a.
                            for col in 0..padded_w {
                                let d = std::array::from_fn(|r| at(4 * a + r, col));
                                let mut parts = vertical.chunks_exact_mut(padded_w * n);
                                let out = std::array::from_fn(|_| {
                                    &mut parts.next().expect("six rows")[col * n..][..n]
                                });
                                input_1d(out, d);
                            }
                            for b in 0..cols {
                                let t0 = (a * cols + b) * n;
                                for k in 0..6 {
                                    let row = &vertical[k * padded_w * n..][..padded_w * n];
                                    let d = std::array::from_fn(|c| &row[(4 * b + c) * n..][..n]);
                                    let mut points = out.chunks_exact_mut(tiles).skip(6 * k);
                                    let out = std::array::from_fn(|_| {
                                        &mut points.next().expect("36 points")[t0..][..n]
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

/// Output tiles `Aᵀ M A` of `m` (`[36, Cout, tiles]`, tile-major order) into `out` (`[images,
/// Cout, Ho, Wo]`), one output channel per task, each tile over all the images.
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
        || vec![0.0f32; 28 * n],
        |scratch, (channel, mut planes)| {
            simd(
                #[inline(always)]
                || {
                    let (columns, results) = scratch.split_at_mut(24 * n);
                    for a in 0..rows {
                        for b in 0..cols {
                            let t0 = (a * cols + b) * n;
                            let point = |p: usize| &m[p * stride + channel * tiles + t0..][..n];
                            // columns[4l + r]: row r of Aᵀ M, column l.
                            for (l, four) in columns.chunks_exact_mut(4 * n).enumerate() {
                                let mut rows_of = four.chunks_exact_mut(n);
                                let out =
                                    std::array::from_fn(|_| rows_of.next().expect("four rows"));
                                output_1d(out, std::array::from_fn(|k| point(6 * k + l)));
                            }
                            let column = |l: usize, r: usize| &columns[(4 * l + r) * n..][..n];
                            for r in 0..4 {
                                let out_row = 4 * a + r;
                                if out_row >= out_h {
                                    break;
                                }
                                let mut values = results.chunks_exact_mut(n);
                                let y: [&mut [f32]; 4] =
                                    std::array::from_fn(|_| values.next().expect("four columns"));
                                let [y0, y1, y2, y3] = y;
                                output_1d(
                                    [&mut *y0, &mut *y1, &mut *y2, &mut *y3],
                                    std::array::from_fn(|l| column(l, r)),
                                );
                                let y = [&*y0, &*y1, &*y2, &*y3];
                                let at = out_row * out_w + 4 * b;
                                let width = (out_w - 4 * b).min(4);
                                for (slot, plane) in planes.iter_mut().enumerate() {
                                    for (q, pixel) in plane[at..][..width].iter_mut().enumerate() {
                                        *pixel = y[q][slot];
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
