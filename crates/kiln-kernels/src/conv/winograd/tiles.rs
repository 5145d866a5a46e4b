//! The data transforms of Winograd F(2×2, 3×3), a whole image plane at a time.
//!
//! Each transform is a short sequence of element-wise operations over long slices (all the
//! tiles of an image plane, even and odd columns split apart first), run under pulp's
//! runtime dispatch (the one gemm uses) so that the compiler vectorizes them to the widest
//! instruction set the CPU has. Only additions, subtractions and sign changes are involved,
//! which round the same at every vector width, so results do not depend on the CPU's SIMD
//! level either. Transformed tiles are laid out `[channel, 16 points, tiles]`, tile `t` =
//! (image slot · tile rows + tile row) · tile columns + tile column, channels
//! [`channel_stride`] apart.

use std::ops::Range;

use rayon::prelude::*;

use crate::simd::simd;

use crate::conv::dims::ConvDims;

/// Points of a transformed 4×4 tile.
pub(crate) const POINTS: usize = 16;

/// Distance between channels in a transformed layout of `points` points per tile, in
/// elements: the points' runs of tiles, plus one cache line. GEMMs read these operands across
/// channels, and with a power-of-two distance every channel's element falls into the same
/// cache sets (gemm's packing of the weight gradient's operands took about 3 ns per element
/// that way).
pub(crate) fn channel_distance(points: usize, tiles: usize) -> usize {
    points * tiles + 16
}

/// [`channel_distance`] of this layout's 16 points.
pub(crate) fn channel_stride(tiles: usize) -> usize {
    channel_distance(POINTS, tiles)
}

/// How a convolution's output is cut into tiles (2×2 here, 4×4 for F(4×4, 3×3); the last row
/// or column of tiles may reach past the output: those outputs are dropped, and their
/// gradients are zero).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tiling {
    /// Tile rows per image.
    pub rows: usize,
    /// Tile columns per image.
    pub cols: usize,
}

impl Tiling {
    /// The 2×2 tiles of `dims`' output.
    pub fn new(dims: &ConvDims) -> Self {
        Self::with_side(dims, 2)
    }

    /// The `side × side` tiles of `dims`' output.
    pub fn with_side(dims: &ConvDims, side: usize) -> Self {
        Self {
            rows: dims.output[0].div_ceil(side),
            cols: dims.output[1].div_ceil(side),
        }
    }

    /// Tiles per image.
    pub fn per_image(self) -> usize {
        self.rows * self.cols
    }
}

/// `dst = a − b`.
#[inline(always)]
pub(crate) fn sub(dst: &mut [f32], a: &[f32], b: &[f32]) {
    for ((d, a), b) in dst.iter_mut().zip(a).zip(b) {
        *d = a - b;
    }
}

/// `dst = a + b`.
#[inline(always)]
pub(crate) fn add(dst: &mut [f32], a: &[f32], b: &[f32]) {
    for ((d, a), b) in dst.iter_mut().zip(a).zip(b) {
        *d = a + b;
    }
}

/// `dst = a + b + c`.
#[inline(always)]
fn add3(dst: &mut [f32], a: &[f32], b: &[f32], c: &[f32]) {
    for (((d, a), b), c) in dst.iter_mut().zip(a).zip(b).zip(c) {
        *d = a + b + c;
    }
}

/// `dst = a − b − c`.
#[inline(always)]
fn sub2(dst: &mut [f32], a: &[f32], b: &[f32], c: &[f32]) {
    for (((d, a), b), c) in dst.iter_mut().zip(a).zip(b).zip(c) {
        *d = a - b - c;
    }
}

/// `dst = −a`.
#[inline(always)]
fn neg(dst: &mut [f32], a: &[f32]) {
    for (d, a) in dst.iter_mut().zip(a) {
        *d = -a;
    }
}

/// Splits `scratch` into `N` consecutive slices of `len`.
#[inline(always)]
fn slices<const N: usize>(scratch: &mut [f32], len: usize) -> [&mut [f32]; N] {
    let mut rest = &mut scratch[..N * len];
    std::array::from_fn(|_| {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        rest = tail;
        head
    })
}

/// The runs of points `first..first + 4` for tiles `t0..t0 + n` in `out` (`[16, tiles]`).
#[inline(always)]
fn points(out: &mut [f32], tiles: usize, first: usize, t0: usize, n: usize) -> [&mut [f32]; 4] {
    let four = &mut out[first * tiles..(first + 4) * tiles];
    let (p0, rest) = four.split_at_mut(tiles);
    let (p1, rest) = rest.split_at_mut(tiles);
    let (p2, p3) = rest.split_at_mut(tiles);
    let run = t0..t0 + n;
    [
        &mut p0[run.clone()],
        &mut p1[run.clone()],
        &mut p2[run.clone()],
        &mut p3[run],
    ]
}

/// Splits `row` (an input row, shifted right by `left` zero columns) into its even and odd
/// columns: `even[k]` = shifted column 2k, `odd[k]` = 2k + 1 (the slices are zeroed first).
#[inline(always)]
fn split_row(row: Option<&[f32]>, left: usize, even: &mut [f32], odd: &mut [f32]) {
    even.fill(0.0);
    odd.fill(0.0);
    let Some(row) = row else {
        return;
    };
    // Input column x lands in shifted column x + left.
    let (first, first_start, second, second_start) = if left.is_multiple_of(2) {
        (even, left / 2, odd, left / 2)
    } else {
        (odd, left / 2, even, left / 2 + 1)
    };
    if let Some(dst) = first.get_mut(first_start..) {
        for (d, v) in dst.iter_mut().zip(row.iter().step_by(2)) {
            *d = *v;
        }
    }
    if let Some(dst) = second.get_mut(second_start..) {
        for (d, v) in dst.iter_mut().zip(row.iter().skip(1).step_by(2)) {
            *d = *v;
        }
    }
}

/// Transformed input tiles `Bᵀ d B` of `images` of `x` (`[N, Cin, H, W]`) into `v`
/// (`[Cin, 16, tiles]`), one channel per task.
///
/// Per image plane: the padded rows are split into even and odd rows and columns; `Bᵀ`
/// down the columns is then four element-wise operations over the whole plane (row `r` of
/// tile row `a` is padded row `2a + r`); `Bᵀ` along the rows, per row of tiles, writes the 16
/// points.
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
    // Split rows and columns: rows + 1 row pairs of cols + 1 column pairs.
    let width = cols + 1;
    let split_len = (rows + 1) * width;
    let vertical_len = rows * width;
    v.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; 4 * split_len + 8 * vertical_len],
            |scratch, (channel, out)| {
                simd(
                    #[inline(always)]
                    || {
                        let (split, vertical) = scratch.split_at_mut(4 * split_len);
                        for (slot, image) in images.clone().enumerate() {
                            let plane = &x[(image * dims.channels + channel) * h * w..][..h * w];
                            // Even rows' even and odd columns, odd rows' even and odd columns.
                            let [ee, eo, oe, oo] = slices::<4>(&mut *split, split_len);
                            for pair in 0..rows + 1 {
                                let range = pair * width..(pair + 1) * width;
                                for (parity, (even, odd)) in
                                    [(&mut *ee, &mut *eo), (&mut *oe, &mut *oo)]
                                        .into_iter()
                                        .enumerate()
                                {
                                    let y = (2 * pair + parity).checked_sub(top).filter(|&y| y < h);
                                    let row = y.map(|y| &plane[y * w..][..w]);
                                    split_row(
                                        row,
                                        left,
                                        &mut even[range.clone()],
                                        &mut odd[range.clone()],
                                    );
                                }
                            }
                            // Bᵀ down the columns, for even and odd columns: rows E[a], O[a],
                            // E[a + 1], O[a + 1] of each tile row.
                            let [v0e, v0o, v1e, v1o, v2e, v2o, v3e, v3o] =
                                slices::<8>(&mut *vertical, vertical_len);
                            for (e, o, [v0, v1, v2, v3]) in [
                                (&*ee, &*oe, [&mut *v0e, &mut *v1e, &mut *v2e, &mut *v3e]),
                                (&*eo, &*oo, [&mut *v0o, &mut *v1o, &mut *v2o, &mut *v3o]),
                            ] {
                                let (e_this, e_next) = (&e[..vertical_len], &e[width..]);
                                let (o_this, o_next) = (&o[..vertical_len], &o[width..]);
                                sub(v0, e_this, e_next);
                                add(v1, o_this, e_next);
                                sub(v2, e_next, o_this);
                                sub(v3, o_this, o_next);
                            }
                            // Bᵀ along the rows: columns e[b], o[b], e[b + 1], o[b + 1] of tile b.
                            let columns: [(&[f32], &[f32]); 4] =
                                [(v0e, v0o), (v1e, v1o), (v2e, v2o), (v3e, v3o)];
                            for (i, (e, o)) in columns.into_iter().enumerate() {
                                for a in 0..rows {
                                    let t0 = (slot * rows + a) * cols;
                                    let start = a * width;
                                    let [p0, p1, p2, p3] = points(out, tiles, 4 * i, t0, cols);
                                    let (e0, e1) = (&e[start..][..cols], &e[start + 1..][..cols]);
                                    let (o0, o1) = (&o[start..][..cols], &o[start + 1..][..cols]);
                                    sub(p0, e0, e1);
                                    add(p1, o0, e1);
                                    sub(p2, e1, o0);
                                    sub(p3, o0, o1);
                                }
                            }
                        }
                    },
                )
            },
        );
}

/// Output tiles `Aᵀ M A` of `m` (`[16, Cout, tiles]`) into `out` (`[images, Cout, Ho, Wo]`),
/// one output plane per task: `Aᵀ` down the columns and along the rows over all of the
/// plane's tiles at once, then the 2×2 results interleaved into the plane's rows.
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
        || vec![0.0f32; 12 * n],
        |scratch, (index, plane)| {
            simd(
                #[inline(always)]
                || {
                    let (slot, channel) = (index / out_channels, index % out_channels);
                    let t0 = slot * n;
                    let point = |p: usize| &m[p * stride + channel * tiles + t0..][..n];
                    let (columns, results) = scratch.split_at_mut(8 * n);
                    {
                        // c{j}{r}: row r of Aᵀ M, column j.
                        let [c00, c01, c10, c11, c20, c21, c30, c31] = slices::<8>(columns, n);
                        for (j, (c0, c1)) in [(c00, c01), (c10, c11), (c20, c21), (c30, c31)]
                            .into_iter()
                            .enumerate()
                        {
                            add3(c0, point(j), point(4 + j), point(8 + j));
                            sub2(c1, point(4 + j), point(8 + j), point(12 + j));
                        }
                    }
                    let columns = &*columns;
                    let c = |j: usize, r: usize| &columns[(2 * j + r) * n..][..n];
                    let [y00, y01, y10, y11] = slices::<4>(results, n);
                    for (r, (y0, y1)) in [(0, (y00, y01)), (1, (y10, y11))] {
                        add3(y0, c(0, r), c(1, r), c(2, r));
                        sub2(y1, c(1, r), c(2, r), c(3, r));
                        for a in 0..rows {
                            let out_row = 2 * a + r;
                            if out_row >= out_h {
                                continue;
                            }
                            let line = &mut plane[out_row * out_w..][..out_w];
                            let (even, odd) = (&y0[a * cols..][..cols], &y1[a * cols..][..cols]);
                            let mut pairs = line.chunks_exact_mut(2);
                            for ((pair, e), o) in (&mut pairs).zip(even).zip(odd) {
                                pair[0] = *e;
                                pair[1] = *o;
                            }
                            if let [last] = pairs.into_remainder() {
                                *last = even[cols - 1];
                            }
                        }
                    }
                },
            )
        },
    );
}

/// Transformed output-gradient tiles `A dY Aᵀ` of `images` of `grad` (`[N, Cout, Ho, Wo]`)
/// into `dm` (`[Cout, 16, tiles]`), one channel per task: the plane's even and odd rows and
/// columns split apart (zero past the output's edge), then `A` down the columns and along the
/// rows over all of its tiles at once.
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
    let (rows, cols) = (tiling.rows, tiling.cols);
    let n = rows * cols;
    dm.par_chunks_mut(channel_stride(tiles))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; 10 * n],
            |scratch, (channel, out)| {
                simd(
                    #[inline(always)]
                    || {
                        for (slot, image) in images.clone().enumerate() {
                            let plane = &grad[(image * out_channels + channel) * out_h * out_w..]
                                [..out_h * out_w];
                            let [e0, o0, e1, o1, se, so, de, d_o, ne, no] =
                                slices::<10>(&mut *scratch, n);
                            for a in 0..rows {
                                let range = a * cols..(a + 1) * cols;
                                for (r, (even, odd)) in
                                    [(0, (&mut *e0, &mut *o0)), (1, (&mut *e1, &mut *o1))]
                                {
                                    let y = 2 * a + r;
                                    let row = (y < out_h).then(|| &plane[y * out_w..][..out_w]);
                                    split_row(
                                        row,
                                        0,
                                        &mut even[range.clone()],
                                        &mut odd[range.clone()],
                                    );
                                }
                            }
                            // A down the columns: v0, v0 + v1, v0 − v1, −v1.
                            add(se, e0, e1);
                            add(so, o0, o1);
                            sub(de, e0, e1);
                            sub(d_o, o0, o1);
                            neg(ne, e1);
                            neg(no, o1);
                            let t0 = slot * n;
                            let rows_of_a: [(&[f32], &[f32]); 4] =
                                [(e0, o0), (se, so), (de, d_o), (ne, no)];
                            for (i, (e, o)) in rows_of_a.into_iter().enumerate() {
                                // A along the rows: e, e + o, e − o, −o.
                                let [p0, p1, p2, p3] = points(out, tiles, 4 * i, t0, n);
                                p0.copy_from_slice(e);
                                add(p1, e, o);
                                sub(p2, e, o);
                                neg(p3, o);
                            }
                        }
                    },
                )
            },
        );
}
