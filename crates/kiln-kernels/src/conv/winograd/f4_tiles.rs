//! The data transforms of Winograd F(4×4, 3×3), a whole image plane at a time.
//!
//! The scheme of F(2×2, 3×3)'s [`crate::conv::winograd::tiles`], for 6×6 input tiles four apart:
//! each plane's padded rows and columns are split by their index modulo 4, so that tile
//! `(a, b)`'s rows `4a..4a + 6` are rows `a` and `a + 1` of the phases, and each step of
//! `Bᵀ d B` and `Aᵀ M A` is one element-wise operation over all of the plane's tiles,
//! compiled for the widest vectors ([`simd`]). `Bᵀ` multiplies by 2, 4 and 5 and `Aᵀ` by 2, 4
//! and 8, never fused, so every element rounds the same way at every vector width.
//! Transformed tiles are laid out `[channel, 36 points, tiles]`, tile `t` = (image slot · tile
//! rows + tile row) · tile columns + tile column, channels [`channel_stride`] apart.

use std::ops::Range;

use rayon::prelude::*;

use crate::conv::dims::ConvDims;
use crate::conv::winograd::tiles::{Tiling, channel_distance};
use crate::simd::simd;

/// Points of a transformed 6×6 tile.
pub(crate) const POINTS: usize = 36;

/// [`channel_distance`] of this layout's 36 points.
pub(crate) fn channel_stride(tiles: usize) -> usize {
    channel_distance(POINTS, tiles)
}

/// Elements per step of [`elementwise`]: one AVX-512 vector.
pub(crate) const LANES: usize = 16;

/// `out[·][i] = f(input[·][i])` for every `i` below `out[0].len()`, [`LANES`] elements at a
/// time through local arrays: with six to twelve slices in one loop the compiler could not
/// rule out their overlap and left the loop scalar (F(4×4)'s transforms then took longer
/// than its GEMMs); over arrays it vectorizes. Runs whose length is a multiple of [`LANES`]
/// take no other path.
#[inline(always)]
fn elementwise<const K: usize, const M: usize>(
    mut out: [&mut [f32]; M],
    input: [&[f32]; K],
    f: impl Fn([f32; K]) -> [f32; M],
) {
    let n = out[0].len();
    let lanes = |ins: [[f32; LANES]; K]| {
        let mut outs = [[0.0f32; LANES]; M];
        // Index loops over the arrays: an iterator adapter here (`zip`) was left a call per
        // element, outside the vectorized code.
        for i in 0..LANES {
            let values = f(std::array::from_fn(|k| ins[k][i]));
            for m in 0..M {
                outs[m][i] = values[m];
            }
        }
        outs
    };
    let whole = n - n % LANES;
    for start in (0..whole).step_by(LANES) {
        let ins = std::array::from_fn(|k| {
            <[f32; LANES]>::try_from(&input[k][start..start + LANES]).expect("LANES elements")
        });
        let outs = lanes(ins);
        for m in 0..M {
            out[m][start..start + LANES].copy_from_slice(&outs[m]);
        }
    }
    if whole < n {
        // Element by element: a copy by length would call memmove.
        let ins = std::array::from_fn(|k| {
            let mut lane = [0.0f32; LANES];
            for (l, v) in lane.iter_mut().zip(&input[k][whole..n]) {
                *l = *v;
            }
            lane
        });
        let outs = lanes(ins);
        for (target, lane) in out.iter_mut().zip(&outs) {
            for (t, l) in target[whole..n].iter_mut().zip(lane) {
                *t = *l;
            }
        }
    }
}

/// `Bᵀ d` for six runs `d` (rows or columns 0..6 of a run of tiles) into six runs `out`:
/// `4d0 − 5d2 + d4`, `(d4 − 4d2) ± (d3 − 4d1)`, `(d4 − d2) ± 2(d3 − d1)`, `4d1 − 5d3 + d5`.
#[inline(always)]
pub(crate) fn input_1d(out: [&mut [f32]; 6], d: [&[f32]; 6]) {
    elementwise(out, d, |[d0, d1, d2, d3, d4, d5]| {
        let (t1, t2) = (d4 - 4.0 * d2, d3 - 4.0 * d1);
        let (t3, t4) = (d4 - d2, 2.0 * (d3 - d1));
        [
            4.0 * d0 - 5.0 * d2 + d4,
            t1 + t2,
            t1 - t2,
            t3 + t4,
            t3 - t4,
            4.0 * d1 - 5.0 * d3 + d5,
        ]
    });
}

/// `Aᵀ m` for six runs `m` into four: `m0 + (m1 + m2) + (m3 + m4)`, `(m1 − m2) + 2(m3 − m4)`,
/// `(m1 + m2) + 4(m3 + m4)`, `(m1 − m2) + 8(m3 − m4) + m5`.
#[inline(always)]
pub(crate) fn output_1d(out: [&mut [f32]; 4], m: [&[f32]; 6]) {
    elementwise(out, m, |[m0, m1, m2, m3, m4, m5]| {
        let (sum12, diff12) = (m1 + m2, m1 - m2);
        let (sum34, diff34) = (m3 + m4, m3 - m4);
        [
            m0 + sum12 + sum34,
            diff12 + 2.0 * diff34,
            sum12 + 4.0 * sum34,
            diff12 + 8.0 * diff34 + m5,
        ]
    });
}

/// Scatters `row` (an input row, shifted right by `left` zero columns) into its columns
/// modulo 4: `phases[k][b]` = shifted column `4b + k`. Elements no input column reaches are
/// left as they are (zero: the same for every plane of a convolution).
#[inline(always)]
fn split_row(row: &[f32], left: usize, phases: [&mut [f32]; 4]) {
    for (k, phase) in phases.into_iter().enumerate() {
        let first = (k + 4 - left % 4) % 4;
        let start = (first + left) / 4;
        if let Some(dst) = phase.get_mut(start..) {
            for (d, v) in dst.iter_mut().zip(row.iter().skip(first).step_by(4)) {
                *d = *v;
            }
        }
    }
}

/// Copies `src` into `dst` (equal lengths): one vector move at ResNet's run lengths, else
/// element by element (a copy by length calls memmove, too slow for runs this short).
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    fn fixed<const N: usize>(dst: &mut [f32], src: &[f32]) -> bool {
        match (<&mut [f32; N]>::try_from(dst), <&[f32; N]>::try_from(src)) {
            (Ok(dst), Ok(src)) => {
                *dst = *src;
                true
            }
            _ => false,
        }
    }
    match dst.len() {
        8 if fixed::<8>(dst, src) => {}
        4 if fixed::<4>(dst, src) => {}
        16 if fixed::<16>(dst, src) => {}
        _ => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
    }
}

/// Transformed input tiles `Bᵀ d B` of `images` of `x` (`[N, Cin, H, W]`) into `v`
/// (`[Cin, 36, tiles]`), one channel per task.
///
/// Per image plane: the padded rows and columns split by index modulo 4 (16 phases of
/// `(rows + 1) × width`, `width = cols + 1`); `Bᵀ` down the columns over every tile row at
/// once (row `r` of tile row `a` is row phase `r % 4` at `a + r / 4`); `Bᵀ` along the rows
/// the same way over the column phases, into runs `width` apart per tile row (the last of
/// each run is past the tiles); then each tile row's `cols` values copied to its points.
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
    let (rows, cols) = (tiling.rows, tiling.cols);
    let width = cols + 1;
    // Runs of rows · width results (the last of each tile row past the tiles), computed to a
    // whole number of vector steps; the phases and rows they read are as much longer (the
    // excess stays zero in the phases and is never copied out).
    let run = (rows * width).next_multiple_of(LANES);
    let split_len = width + run;
    // Along the rows, columns 4 and 5 read one element past a run's start.
    let vertical_len = run + 1;
    v.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; 16 * split_len + 24 * vertical_len + 36 * run],
            |scratch, (channel, out)| {
                simd(
                    #[inline(always)]
                    || {
                        let (split, rest) = scratch.split_at_mut(16 * split_len);
                        let (vertical, horizontal) = rest.split_at_mut(24 * vertical_len);
                        // phase[4 · (row % 4) + column % 4][row / 4 · width + column / 4]
                        let mut phase: Vec<&mut [f32]> =
                            split.chunks_exact_mut(split_len).collect();
                        let mut vert: Vec<&mut [f32]> =
                            vertical.chunks_exact_mut(vertical_len).collect();
                        let mut points: Vec<&mut [f32]> =
                            horizontal.chunks_exact_mut(run).collect();
                        for (slot, image) in images.clone().enumerate() {
                            let plane = &x[(image * dims.channels + channel) * h * w..][..h * w];
                            // Only the input's rows: the padding's stay zero from the start.
                            for (y, row) in plane.chunks_exact(w).enumerate() {
                                let (a, pr) = ((y + top) / 4, (y + top) % 4);
                                let range = a * width..(a + 1) * width;
                                let [p0, p1, p2, p3] = &mut phase[4 * pr..4 * pr + 4] else {
                                    unreachable!("four column phases")
                                };
                                split_row(
                                    row,
                                    left,
                                    [
                                        &mut p0[range.clone()],
                                        &mut p1[range.clone()],
                                        &mut p2[range.clone()],
                                        &mut p3[range],
                                    ],
                                );
                            }
                            // vertical[6 · column phase + k]: row k of Bᵀ d, every tile row.
                            for pc in 0..4 {
                                let d = std::array::from_fn(|r| {
                                    &phase[4 * (r % 4) + pc][(r / 4) * width..][..run]
                                });
                                let mut outs = vert[6 * pc..6 * pc + 6].iter_mut();
                                let o = std::array::from_fn(|_| {
                                    &mut outs.next().expect("six rows")[..run]
                                });
                                input_1d(o, d);
                            }
                            // points[6k + l]: point 6k + l of every tile, `width` apart.
                            for k in 0..6 {
                                let d =
                                    std::array::from_fn(|c| &vert[6 * (c % 4) + k][c / 4..][..run]);
                                let mut outs = points[6 * k..6 * k + 6].iter_mut();
                                let o = std::array::from_fn(|_| {
                                    &mut **outs.next().expect("six points")
                                });
                                input_1d(o, d);
                            }
                            for (point, values) in points.iter().enumerate() {
                                let dst =
                                    &mut out[point * tiles + slot * rows * cols..][..rows * cols];
                                for (tile_row, src) in
                                    dst.chunks_exact_mut(cols).zip(values.chunks(width))
                                {
                                    copy_short(tile_row, &src[..cols]);
                                }
                            }
                        }
                    },
                )
            },
        );
}

/// Output tiles `Aᵀ M A` of `m` (`[36, Cout, tiles]`) into `out` (`[images, Cout, Ho, Wo]`),
/// one output plane per task: `Aᵀ` down the columns and along the rows over all of the
/// plane's tiles at once, then the 4×4 results interleaved into the plane's rows.
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
    let (rows, cols) = (tiling.rows, tiling.cols);
    let n = rows * cols;
    out.par_chunks_mut(out_h * out_w).enumerate().for_each_init(
        || vec![0.0f32; 28 * n],
        |scratch, (index, plane)| {
            simd(
                #[inline(always)]
                || {
                    let (slot, channel) = (index / out_channels, index % out_channels);
                    let t0 = slot * n;
                    let point = |p: usize| &m[p * stride + channel * tiles + t0..][..n];
                    let (columns, results) = scratch.split_at_mut(24 * n);
                    // columns[4 · l + r]: row r of Aᵀ M, column l.
                    for (l, four) in columns.chunks_exact_mut(4 * n).enumerate() {
                        let mut rows_of = four.chunks_exact_mut(n);
                        let o = std::array::from_fn(|_| rows_of.next().expect("four rows"));
                        output_1d(o, std::array::from_fn(|k| point(6 * k + l)));
                    }
                    let column = |l: usize, r: usize| &columns[(4 * l + r) * n..][..n];
                    for r in 0..4 {
                        let mut values = results.chunks_exact_mut(n);
                        let y: [&mut [f32]; 4] =
                            std::array::from_fn(|_| values.next().expect("four columns"));
                        let [y0, y1, y2, y3] = y;
                        output_1d(
                            [&mut *y0, &mut *y1, &mut *y2, &mut *y3],
                            std::array::from_fn(|l| column(l, r)),
                        );
                        let y = [&*y0, &*y1, &*y2, &*y3];
                        for a in 0..rows {
                            let out_row = 4 * a + r;
                            if out_row >= out_h {
                                break;
                            }
                            let line = &mut plane[out_row * out_w..][..out_w];
                            for (b, pixels) in line.chunks_mut(4).enumerate() {
                                for (q, pixel) in pixels.iter_mut().enumerate() {
                                    *pixel = y[q][a * cols + b];
                                }
                            }
                        }
                    }
                },
            )
        },
    );
}
