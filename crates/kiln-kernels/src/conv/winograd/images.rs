//! Winograd's data transforms for small images, vectorized across the images of a block
//! instead of along a plane's tiles, for any tile size: F(2×2, 3×3) (`winograd/batched.rs`) and
//! F(4×4, 3×3) (`winograd/f4.rs`) pass their 1-D transforms.
//!
//! At an 8×8 output (F(2×2)) or a 16×16 one (F(4×4)) a tile row is 4 tiles, so the plane-wise
//! transforms ran on 4-element slices (F(2×2)'s input transform cost a third of the GEMMs'
//! time at 64 channels, F(4×4)'s 1.6× them at 128). Here the tiles of a block are ordered
//! tile-major, `t = (tile row · tile columns + tile column) · images + slot`, so every step
//! runs over the block's images at once. The arithmetic of each element is the plane-wise
//! transforms', in the same order; only the tiles' order differs, which the GEMMs do not see
//! except as the order of the weight gradient's sum over tiles (fixed by the shapes, like
//! every other order here).

use std::ops::Range;

use rayon::prelude::*;

use crate::conv::dims::ConvDims;
use crate::conv::winograd::tiles::{Tiling, channel_distance};
use crate::simd::simd;

/// Transformed input tiles `Bᵀ d B` of `images` of `x` (`[N, Cin, H, W]`) into `v`
/// (`[Cin, R², tiles]`, tile-major order) for input tiles of `R × R` (`R − 2` apart) and
/// `input_1d` (`Bᵀ` of `R` runs into `R`), one channel per task: the channel's planes
/// gathered into a zero-padded `[y, x, image]` block, then per tile row `Bᵀ` down every padded
/// column and per tile `Bᵀ` along the rows, each over all the images.
pub(crate) fn transform_input<const R: usize>(
    x: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    images: Range<usize>,
    v: &mut [f32],
    input_1d: impl Fn([&mut [f32]; R], [&[f32]; R]) + Sync,
) {
    let step = R - 2;
    let [h, w] = dims.input;
    let n = images.len();
    let tiles = n * tiling.per_image();
    let (top, left) = (dims.geometry.padding[0].0, dims.geometry.padding[1].0);
    let (rows, cols) = (tiling.rows, tiling.cols);
    // The rows and columns the tiles read. The block holds every input element: padding + H
    // ≤ Ho + 2 ≤ step · rows + 2 for a 3×3 kernel (and the same across).
    let (padded_h, padded_w) = (step * rows + 2, step * cols + 2);
    v.par_chunks_mut(channel_distance(R * R, tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; (padded_h + R) * padded_w * n],
            |scratch, (channel, out)| {
                simd(
                    #[inline(always)]
                    || {
                        let (gathered, vertical) = scratch.split_at_mut(padded_h * padded_w * n);
                        let planes = planes(x, dims.channels, channel, [h, w], images.clone());
                        gather_across_images(planes, w, (top, left), padded_w, gathered);
                        let at = |y: usize, x: usize| &gathered[(y * padded_w + x) * n..][..n];
                        for a in 0..rows {
                            // vertical[i][x]: row i of Bᵀ d down padded column x of tile row a.
                            for col in 0..padded_w {
                                let d = std::array::from_fn(|r| at(step * a + r, col));
                                let mut parts = vertical.chunks_exact_mut(padded_w * n);
                                let out = std::array::from_fn(|_| {
                                    &mut parts.next().expect("R rows")[col * n..][..n]
                                });
                                input_1d(out, d);
                            }
                            for b in 0..cols {
                                let t0 = (a * cols + b) * n;
                                for i in 0..R {
                                    let row = &vertical[i * padded_w * n..][..padded_w * n];
                                    let d =
                                        std::array::from_fn(|c| &row[(step * b + c) * n..][..n]);
                                    let mut points = out.chunks_exact_mut(tiles).skip(R * i);
                                    let out = std::array::from_fn(|_| {
                                        &mut points.next().expect("R² points")[t0..][..n]
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

/// The `[h, w]` planes of `channel` of `images` in `values` (`[N, channels, h, w]`).
pub(crate) fn planes(
    values: &[f32],
    channels: usize,
    channel: usize,
    [h, w]: [usize; 2],
    images: Range<usize>,
) -> impl ExactSizeIterator<Item = &[f32]> {
    images.map(move |image| &values[(image * channels + channel) * h * w..][..h * w])
}

/// `planes` (`w` wide, one per image) interleaved into `gathered`, a zeroed `[y, x, image]`
/// block `block_w` wide, each plane's element `(y, x)` at `(y + top, x + left)`.
pub(crate) fn gather_across_images<'a>(
    planes: impl ExactSizeIterator<Item = &'a [f32]>,
    w: usize,
    (top, left): (usize, usize),
    block_w: usize,
    gathered: &mut [f32],
) {
    let n = planes.len();
    gathered.fill(0.0);
    for (slot, plane) in planes.enumerate() {
        for (y, row) in plane.chunks_exact(w).enumerate() {
            let base = ((y + top) * block_w + left) * n + slot;
            for (col, value) in row.iter().enumerate() {
                gathered[base + col * n] = *value;
            }
        }
    }
}

/// Output tiles `Aᵀ M A` of `m` (`[R², Cout, tiles]`, tile-major order) into `out` (`[images,
/// Cout, Ho, Wo]`) for output tiles of `S × S` and `output_1d` (`Aᵀ` of `R` runs into `S`),
/// one output channel per task, each tile over all the images.
pub(crate) fn transform_output<const R: usize, const S: usize>(
    m: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    out_channels: usize,
    tiles: usize,
    out: &mut [f32],
    output_1d: impl Fn([&mut [f32]; S], [&[f32]; R]) + Sync,
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
        || vec![0.0f32; (R + 1) * S * n],
        |scratch, (channel, mut planes)| {
            simd(
                #[inline(always)]
                || {
                    let (columns, results) = scratch.split_at_mut(R * S * n);
                    for a in 0..rows {
                        for b in 0..cols {
                            let t0 = (a * cols + b) * n;
                            let point = |p: usize| &m[p * stride + channel * tiles + t0..][..n];
                            // columns[S · l + r]: row r of Aᵀ M, column l.
                            for (l, column) in columns.chunks_exact_mut(S * n).enumerate() {
                                let mut rows_of = column.chunks_exact_mut(n);
                                let out = std::array::from_fn(|_| rows_of.next().expect("S rows"));
                                output_1d(out, std::array::from_fn(|k| point(R * k + l)));
                            }
                            let column = |l: usize, r: usize| &columns[(S * l + r) * n..][..n];
                            let width = (out_w - S * b).min(S);
                            for r in 0..S {
                                let out_row = S * a + r;
                                if out_row >= out_h {
                                    break;
                                }
                                {
                                    let mut values = results.chunks_exact_mut(n);
                                    let y =
                                        std::array::from_fn(|_| values.next().expect("S columns"));
                                    output_1d(y, std::array::from_fn(|l| column(l, r)));
                                }
                                let y: [&[f32]; S] =
                                    std::array::from_fn(|q| &results[q * n..][..n]);
                                let at = out_row * out_w + S * b;
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
