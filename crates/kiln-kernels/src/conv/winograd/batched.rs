//! Winograd F(2×2, 3×3)'s data transforms for small images, vectorized across the images of
//! a block instead of along a row of tiles (see [`crate::conv::winograd::images`], which runs the
//! input and output transforms with the 1-D transforms here): at an 8×8 output a tile row is
//! 4 tiles, 16 or 32 images a block. The weight gradient's output-gradient transform is
//! F(2×2)'s alone and lives here too. The arithmetic of each element is the one
//! `winograd/tiles.rs` does, in the same order; only the tiles' order differs.

use std::ops::Range;

use rayon::prelude::*;

use crate::conv::dims::ConvDims;
use crate::conv::winograd::images::{self, gather_across_images, planes};
use crate::conv::winograd::tiles::{Tiling, add, channel_stride, sub};
use crate::simd::simd;

/// Whether a block of `images` images of `tiling` takes these transforms: tile rows too short
/// for `winograd/tiles.rs`' runs and enough images to fill a vector.
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

/// `Aᵀ` of a column (or row) of 4 vectors `m` into 2: `m0 + m1 + m2, m1 − m2 − m3`.
#[inline(always)]
fn output_1d(out: [&mut [f32]; 2], m: [&[f32]; 4]) {
    let [y0, y1] = out;
    for (((((d0, d1), p0), p1), p2), p3) in y0
        .iter_mut()
        .zip(y1.iter_mut())
        .zip(m[0])
        .zip(m[1])
        .zip(m[2])
        .zip(m[3])
    {
        *d0 = p0 + p1 + p2;
        *d1 = p1 - p2 - p3;
    }
}

/// Transformed input tiles of `images` of `x` (`[N, Cin, H, W]`) into `v` (`[Cin, 16,
/// tiles]`, tile-major order), across the images ([`images::transform_input`]).
pub(crate) fn transform_input(
    x: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    images: Range<usize>,
    v: &mut [f32],
) {
    images::transform_input::<4>(x, dims, tiling, images, v, input_1d);
}

/// Output tiles `Aᵀ M A` of `m` (`[16, Cout, tiles]`, tile-major order) into `out`
/// (`[images, Cout, Ho, Wo]`), across the images ([`images::transform_output`]).
pub(crate) fn transform_output(
    m: &[f32],
    dims: &ConvDims,
    tiling: Tiling,
    out_channels: usize,
    tiles: usize,
    out: &mut [f32],
) {
    images::transform_output::<4, 2>(m, dims, tiling, out_channels, tiles, out, output_1d);
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
                        let size = [out_h, out_w];
                        let planes = planes(grad, out_channels, channel, size, images.clone());
                        gather_across_images(planes, out_w, (0, 0), tiled_w, gathered);
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
