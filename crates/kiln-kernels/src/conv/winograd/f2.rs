//! Winograd F(2×2, 3×3): 3×3 unit-stride convolutions with 2.25× fewer multiply-adds than
//! im2col + GEMM.
//!
//! Each 2×2 output tile is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` of its 4×4 input tile `d` (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). Summed over the input
//! channels, the element-wise products become 16 GEMMs per block of images, `U[ξ] [Cout, Cin]
//! × V[ξ] [Cin, tiles]`, on the same gemm kernels as the im2col path: 16 multiply-adds per
//! tile and channel pair where im2col spends 36. The weight gradient is the adjoint of the same
//! computation, `Gᵀ (Σ_tiles (A dY Aᵀ) ⊙ V) G`, 16 GEMMs over the tiles; the input gradient of a
//! unit-stride convolution is a forward convolution with the flipped kernel (`conv/flex.rs`), so
//! it takes this path too.
//!
//! The transforms' coefficients are 0, ±1 and ½, so the only rounding is that of the sums,
//! which stay within the tolerance the im2col path meets against Burn. Blocks, tiles and every
//! summation order follow the shapes, never the thread count.

use std::ops::Range;

use rayon::prelude::*;

use crate::conv::block_sum::{block, sum_over_blocks};
use crate::conv::dims::ConvDims;
use crate::conv::shifted;
use crate::conv::winograd::batched;
use crate::conv::winograd::tiles::{
    POINTS, Tiling, channel_distance, channel_stride, transform_input, transform_output,
    transform_output_grad,
};
use crate::gemm::{Matrix, matmul};
use crate::scratch::ScratchPair;
use crate::zeroed::zeroed;

/// Tiles a forward block's GEMMs should see at least (the column count of each of its 16
/// GEMMs).
const BLOCK_TILES: usize = 256;

/// Tiles a weight-gradient block should hold at least (the inner dimension of its 16 GEMMs):
/// more than the forward's, since each GEMM's whole `[Cin, Cout]` result is read and written
/// per block (512 measured up to 1.5× faster than 256 at 256 channels, 8×8).
const WEIGHT_BLOCK_TILES: usize = 512;

/// Fewest input and output channels for which the transforms pay. Measured on ResNet-18's
/// shapes (one thread, AMD EPYC Zen 4, batch 32, against im2col): forward 1.4–1.6× and
/// weight gradient 1.4–2.0× faster at 64–256 channels, 1.1–1.15× at 32 (16×16), mixed at 16
/// (32×32: forward 0.76×), where each of the 16 GEMMs is too thin for gemm's kernels and
/// im2col's single GEMM of inner dimension `9·Cin` wins.
pub(crate) const MIN_CHANNELS: usize = 32;

/// Smallest output height and width that takes this path: at 4×4 (512 channels) a tile row
/// is two tiles, the 16 transformed kernels (16 MB) dominate, and the forward ran 0.87× as
/// fast as im2col's.
pub(crate) const MIN_OUTPUT: usize = 8;

/// Whether a convolution of `dims` with `out_channels` outputs takes this path: a 3×3 kernel,
/// unit stride and dilation (any padding), at least [`MIN_CHANNELS`] channels each side and
/// an output of at least [`MIN_OUTPUT`] in both dimensions.
pub(crate) fn applies(dims: &ConvDims, out_channels: usize) -> bool {
    shape_fits(dims, out_channels) && dims.output[0].min(dims.output[1]) >= MIN_OUTPUT
}

/// Most channel pairs (`Cin·Cout`) for which the weight gradient takes this path at outputs
/// from 4×4 up to [`MIN_OUTPUT`]: there its 32-image blocks transform across images
/// (`winograd/batched.rs`) and, measured at 4×4 (one thread, batch 32), ran 1.25× im2col's at
/// 128 channels and 0.9× at 512, where the 16 transformed partial sums (16 MB) dominate.
const SMALL_OUTPUT_MAX_PAIRS: usize = 128 * 128;

/// Fewest channel pairs (`Cin·Cout`) for which this weight gradient is taken where the shifted
/// GEMMs apply too: measured (one thread, batch 32, freed memory kept) they ran 0.63–0.83× its
/// time at 32–64 channels on 16×16 and 32×32 outputs, and it 0.88× theirs at 128 on 16×16.
pub(crate) const OVER_SHIFTED_MIN_PAIRS: usize = 128 * 128;

/// Whether the weight gradient of `dims` takes this path: where [`applies`] holds, and at
/// outputs of at least 4×4 for up to [`SMALL_OUTPUT_MAX_PAIRS`] channel pairs; where the
/// shifted GEMMs apply too, only from [`OVER_SHIFTED_MIN_PAIRS`] channel pairs.
pub(crate) fn applies_to_weight_gradient(dims: &ConvDims, out_channels: usize) -> bool {
    let side = dims.output[0].min(dims.output[1]);
    let pairs = dims.channels * out_channels;
    shape_fits(dims, out_channels)
        && (side >= MIN_OUTPUT || (side >= 4 && pairs <= SMALL_OUTPUT_MAX_PAIRS))
        && (pairs >= OVER_SHIFTED_MIN_PAIRS || !shifted::applies(dims))
}

/// A 3×3 kernel, unit stride and dilation, at least [`MIN_CHANNELS`] channels each side.
pub(crate) fn shape_fits(dims: &ConvDims, out_channels: usize) -> bool {
    let g = dims.geometry;
    dims.kernel == [3, 3]
        && g.stride == [1, 1]
        && g.dilation == [1, 1]
        && dims.channels >= MIN_CHANNELS
        && out_channels >= MIN_CHANNELS
}

/// Images per block of `tiling`: enough for `tiles` tiles.
fn block_images(tiling: Tiling, tiles: usize) -> usize {
    tiles.div_ceil(tiling.per_image().max(1)).max(1)
}

/// `G v` for a column or row of a kernel.
#[inline(always)]
fn kernel_1d(v: [f32; 3]) -> [f32; 4] {
    [
        v[0],
        0.5 * (v[0] + v[1] + v[2]),
        0.5 * (v[0] - v[1] + v[2]),
        v[2],
    ]
}

/// `Gᵀ v` for a column or row of a transformed kernel gradient (the adjoint of
/// [`kernel_1d`]).
#[inline(always)]
fn kernel_grad_1d(v: [f32; 4]) -> [f32; 3] {
    [
        v[0] + 0.5 * (v[1] + v[2]),
        0.5 * (v[1] - v[2]),
        0.5 * (v[1] + v[2]) + v[3],
    ]
}

/// `T t Tᵀ` for a row-major `R×R` tile `t` and a 1-D transform `T: R → S`, columns first.
#[inline(always)]
fn both_ways<const R: usize, const S: usize>(
    t: [[f32; R]; R],
    transform: impl Fn([f32; R]) -> [f32; S],
) -> [[f32; S]; S] {
    let mut columns = [[0.0f32; R]; S];
    for j in 0..R {
        let column = transform(std::array::from_fn(|i| t[i][j]));
        for i in 0..S {
            columns[i][j] = column[i];
        }
    }
    std::array::from_fn(|i| transform(columns[i]))
}

/// Kernel pairs per parallel piece of [`transform_kernel`] and the weight gradient's last
/// transform (both are memory-bound gathers and scatters; serial, they were a tenth of a
/// width-64 step's main thread on 2 threads).
const PAIRS_PER_PIECE: usize = 512;

/// The transformed kernel `G g Gᵀ` of `weight` (`[Cout, Cin·9]`) for the 1-D transform
/// `kernel_1d` (`G`, 3 → `S`), laid out `[S², Cout, Cin]`: one row-major GEMM operand per
/// point. Pieces of pairs run in parallel, each writing its own range of every point's row.
pub(crate) fn transform_kernel<const S: usize>(
    weight: &[f32],
    channels: usize,
    out_channels: usize,
    kernel_1d: impl Fn([f32; 3]) -> [f32; S] + Sync,
) -> Vec<f32> {
    let pairs = out_channels * channels;
    let mut u = zeroed(S * S * pairs);
    // pieces[k][point]: piece k's range of that point's row.
    let mut pieces: Vec<Vec<&mut [f32]>> = Vec::new();
    for row in u.chunks_mut(pairs.max(1)) {
        for (k, range) in row.chunks_mut(PAIRS_PER_PIECE).enumerate() {
            if pieces.len() <= k {
                pieces.push(Vec::with_capacity(S * S));
            }
            pieces[k].push(range);
        }
    }
    pieces
        .into_par_iter()
        .enumerate()
        .for_each(|(k, mut rows)| {
            let start = k * PAIRS_PER_PIECE;
            let kernels = weight[start * 9..].chunks_exact(9).take(rows[0].len());
            for (offset, g) in kernels.enumerate() {
                let g: [[f32; 3]; 3] =
                    std::array::from_fn(|i| [g[3 * i], g[3 * i + 1], g[3 * i + 2]]);
                for (point, value) in both_ways(g, &kernel_1d).iter().flatten().enumerate() {
                    rows[point][offset] = *value;
                }
            }
        });
    u
}

/// `x` `[N, Cin, H, W]` convolved with `weight` `[Cout, Cin·9]` (see [`applies`]): `[N, Cout,
/// Ho, Wo]`.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let tiling = Tiling::new(dims);
    let u = transform_kernel(weight, dims.channels, out_channels, kernel_1d);
    let size = block_images(tiling, BLOCK_TILES);
    let batched = |images: &Range<usize>| batched::applies(tiling, images.len());
    forward_blocks(
        dims,
        (batch, out_channels),
        (tiling, size),
        (POINTS, &u),
        |images, v| {
            if batched(&images) {
                batched::transform_input(x, dims, tiling, images, v);
            } else {
                transform_input(x, dims, tiling, images, v);
            }
        },
        |m, images, out| {
            let tiles = images.len() * tiling.per_image();
            if batched(&images) {
                batched::transform_output(m, dims, tiling, out_channels, tiles, out);
            } else {
                transform_output(m, dims, tiling, out_channels, tiles, out);
            }
        },
    )
}

/// A Winograd forward's blocks, for any tile size: `size` images a block (of `tiling`'s
/// tiles), each block's input transformed into `v` (`[Cin, points, tiles]`, channels `points ·
/// tiles + 16` apart) by `input(images, v)`, one GEMM per point of the transformed kernel `u`
/// (`[points, Cout, Cin]`) into `m` (`[points, Cout, tiles]`), and `m` into the block's output
/// (`[images, Cout, Ho, Wo]`) by `output(m, images, out)`. Blocks run in parallel, each reusing
/// its rayon split's buffers.
pub(crate) fn forward_blocks(
    dims: &ConvDims,
    (batch, out_channels): (usize, usize),
    (tiling, size): (Tiling, usize),
    (points, u): (usize, &[f32]),
    input: impl Fn(Range<usize>, &mut [f32]) + Sync,
    output: impl Fn(&[f32], Range<usize>, &mut [f32]) + Sync,
) -> Vec<f32> {
    let plane = dims.output[0] * dims.output[1];
    let pairs = out_channels * dims.channels;
    let mut result = zeroed(batch * out_channels * plane);
    result
        .par_chunks_mut(size * out_channels * plane)
        .enumerate()
        .for_each_init(ScratchPair::take, |scratch, (index, out)| {
            let images = block(index, size, batch);
            let tiles = images.len() * tiling.per_image();
            let channel_stride = channel_distance(points, tiles);
            // Both written in full before they are read: `v` by the input transform
            // (the GEMMs read no channel's padding), `m` by the GEMMs.
            let (v, m) = scratch.get(
                dims.channels * channel_stride,
                points * out_channels * tiles,
            );
            input(images.clone(), v);
            let lhs = Matrix::row_major(out_channels, dims.channels);
            let rhs = Matrix {
                rows: dims.channels,
                cols: tiles,
                row_stride: channel_stride,
                col_stride: 1,
            };
            for point in 0..points {
                matmul(
                    &mut m[point * out_channels * tiles..][..out_channels * tiles],
                    false,
                    (&u[point * pairs..][..pairs], lhs),
                    (&v[point * tiles..], rhs),
                );
            }
            output(m, images, out);
        });
    result
}

/// The weight gradient `[Cout, Cin·9]` of [`forward`] given the output gradient `grad`:
/// blocks summed in a fixed order ([`sum_over_blocks`]), each adding its 16 GEMMs `V[ξ] × dM[ξ]ᵀ` (`[Cin,
/// Cout]`, the orientation in which gemm repacks the output gradient's tiles, as the im2col
/// path's weight gradient does), then `Gᵀ dU G` per kernel.
pub(crate) fn weight_gradient(
    x: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let tiling = Tiling::new(dims);
    let size = block_images(tiling, WEIGHT_BLOCK_TILES);
    let pairs = dims.channels * out_channels;
    let total = sum_over_blocks(
        batch.div_ceil(size),
        POINTS * pairs,
        ScratchPair::take,
        |partial, accumulate, index, scratch| {
            let images = block(index, size, batch);
            let tiles = images.len() * tiling.per_image();
            // Both written in full by the transforms before the GEMMs read them.
            let (v, dm) = scratch.get(
                dims.channels * channel_stride(tiles),
                out_channels * channel_stride(tiles),
            );
            if batched::applies(tiling, images.len()) {
                batched::transform_input(x, dims, tiling, images.clone(), v);
                batched::transform_output_grad(grad, dims, tiling, out_channels, images, dm);
            } else {
                transform_input(x, dims, tiling, images.clone(), v);
                transform_output_grad(grad, dims, tiling, out_channels, images, dm);
            }
            let strided = |rows| Matrix {
                rows,
                cols: tiles,
                row_stride: channel_stride(tiles),
                col_stride: 1,
            };
            for point in 0..POINTS {
                matmul(
                    &mut partial[point * pairs..][..pairs],
                    accumulate,
                    (&v[point * tiles..], strided(dims.channels)),
                    (&dm[point * tiles..], strided(out_channels).transposed()),
                );
            }
        },
    );
    // [16, Cin, Cout] -> [Cout, Cin, 3, 3], pieces of pairs in parallel.
    let mut weight_grad = zeroed(pairs * 9);
    weight_grad
        .par_chunks_mut(9 * PAIRS_PER_PIECE)
        .enumerate()
        .for_each(|(k, piece)| {
            for (offset, kernel) in piece.chunks_exact_mut(9).enumerate() {
                let pair = k * PAIRS_PER_PIECE + offset;
                let (o, c) = (pair / dims.channels, pair % dims.channels);
                let du: [[f32; 4]; 4] = std::array::from_fn(|i| {
                    std::array::from_fn(|j| total[(4 * i + j) * pairs + c * out_channels + o])
                });
                for (value, g) in kernel
                    .iter_mut()
                    .zip(both_ways(du, kernel_grad_1d).iter().flatten())
                {
                    *value = *g;
                }
            }
        });
    weight_grad
}
