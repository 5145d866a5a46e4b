//! The direct weight gradient: `dW[o, c, i, j] = Σ_positions dY[o, position] · x[c, window + (i,
//! j)]` summed in registers, a tile of (input channel, kernel row) pairs × kernel columns ×
//! 16 or 32 output channels at a time, over every output position, reading the zero-padded
//! input in place (`direct/tile.rs`; im2col + GEMM copies every input value `kh·kw` times first).
//!
//! The output gradient is packed once as `[Cout/W, N·Ho·Wo, W]` (`W` the tile's channels) so
//! that each position's `W` values are one or two vectors. Positions are taken in chunks, every
//! tile of a parallel piece summing one chunk before the next, so a chunk is read from the
//! cache near the core; each tile's sums run over the positions in order whatever the pieces,
//! so results do not depend on the thread count.

use rayon::prelude::*;

use crate::conv::dims::ConvDims;
use crate::conv::direct::forward::padded;
use crate::conv::direct::tile::{self, ColumnSkip, LANES, Steps, TileSource};
use crate::zeroed::zeroed;

/// Output positions every tile of a piece sums before the next chunk (the chunk of the packed
/// output gradient, 32–64 KB, stays in the core's cache across the piece's tiles).
const CHUNK_POSITIONS: usize = 512;

/// Whether the direct kernel can compute this weight gradient: output channels a multiple
/// of 16, the same stride of 1 or 2 both ways, no dilation, kernels 1 or 3 wide.
pub(crate) fn shape_fits(dims: &ConvDims, out_channels: usize) -> bool {
    let stride = dims.geometry.stride;
    out_channels > 0
        && out_channels.is_multiple_of(LANES)
        && stride[0] == stride[1]
        && (1..=2).contains(&stride[0])
        && dims.geometry.dilation == [1, 1]
        && matches!(dims.kernel[1], 1 | 3)
        && dims.positions() > 0
}

/// Whether the weight gradient of `dims` takes this path: where it fits and the CPU runs the
/// AVX-512 tile.
pub(crate) fn applies(dims: &ConvDims, out_channels: usize) -> bool {
    tile::fast() && shape_fits(dims, out_channels)
}

/// The weight gradient `[Cout, Cin·kh·kw]` of `x` `[N, Cin, H, W]` given the output gradient
/// `grad` `[N, Cout, Ho, Wo]`.
///
/// # Panics
///
/// If the shape does not fit ([`shape_fits`]) or a slice is shorter than its shape.
pub(crate) fn weight_gradient(
    x: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    assert!(
        shape_fits(dims, out_channels),
        "direct weight gradient: shape"
    );
    assert!(x.len() >= batch * dims.image_len());
    assert!(grad.len() >= batch * out_channels * dims.positions());
    let wide = out_channels.is_multiple_of(2 * LANES);
    match (dims.kernel[1], wide) {
        (3, true) => weight_gradient_with::<4, 3, 2>(x, grad, dims, batch, out_channels),
        (3, false) => weight_gradient_with::<8, 3, 1>(x, grad, dims, batch, out_channels),
        // Eight or twelve rows, not 12 or 24: each row is a pointer in a general register, and
        // more spill accumulators.
        (_, true) => weight_gradient_with::<8, 1, 2>(x, grad, dims, batch, out_channels),
        (_, false) => weight_gradient_with::<12, 1, 1>(x, grad, dims, batch, out_channels),
    }
}

/// Tiles of `ROWS` (input channel, kernel row) pairs × `COLUMNS` kernel columns (the kernel's
/// width) × `VECTORS·16` output channels.
fn weight_gradient_with<const ROWS: usize, const COLUMNS: usize, const VECTORS: usize>(
    x: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let width = VECTORS * LANES;
    let (input, [_, padded_w]) = padded(x, dims, batch);
    let plane = input.len() / (batch * dims.channels).max(1);
    let image = dims.channels * plane;
    let stride = dims.geometry.stride[0];
    let [_, out_w] = dims.output;
    let positions = dims.positions();
    let total = batch * positions;
    // Whole images per chunk, so that the offsets of one chunk's positions serve every chunk
    // (each chunk's tiles start one image further on).
    let chunk_images = CHUNK_POSITIONS.div_ceil(positions).min(batch).max(1);
    let steps: Vec<usize> = (0..chunk_images * positions)
        .map(|q| {
            let (b, p) = (q / positions, q % positions);
            b * image + (p / out_w) * stride * padded_w + (p % out_w) * stride
        })
        .collect();
    let packed = packed_grad(grad, batch, out_channels, positions, width);
    let kernel_rows = dims.kernel[0];
    let pairs = dims.channels * kernel_rows;
    let row_offset = |pair: usize| (pair / kernel_rows) * plane + (pair % kernel_rows) * padded_w;
    let tiles = pairs.div_ceil(ROWS);
    let blocks = out_channels / width;
    // As few pieces as keep every thread busy: each piece reads its block's whole output
    // gradient once (from the shared cache when it outgrows the core's), so with four pieces
    // per thread two threads ran no faster than one.
    let threads = rayon::current_num_threads();
    let group = tiles.div_ceil(threads.div_ceil(blocks)).max(1);
    let padded_tiles = tiles.div_ceil(group) * group;
    let tile_len = ROWS * COLUMNS * width;
    let mut sums = zeroed(blocks * padded_tiles * tile_len);
    sums.par_chunks_mut(group * tile_len)
        .enumerate()
        .for_each(|(piece, out)| {
            let block = piece * group / padded_tiles;
            let first_tile = piece * group % padded_tiles;
            let block_grad = &packed[block * total * width..][..total * width];
            for first_image in (0..batch).step_by(chunk_images) {
                let images = chunk_images.min(batch - first_image);
                let (start, end) = (first_image * positions, (first_image + images) * positions);
                let chunk_steps = Steps::new(&steps[..end - start]);
                for (index, tile) in out.chunks_exact_mut(tile_len).enumerate() {
                    let first_pair = (first_tile + index) * ROWS;
                    if first_pair >= pairs {
                        break;
                    }
                    // Rows past the last pair repeat it; their sums are never read.
                    let rows = std::array::from_fn(|r| {
                        first_image * image + row_offset((first_pair + r).min(pairs - 1))
                    });
                    let source = TileSource {
                        input: &input,
                        rows,
                        steps: chunk_steps,
                        operand: &block_grad[start * width..end * width],
                        skip: ColumnSkip::NONE,
                    };
                    tile::accumulate::<ROWS, COLUMNS, 1, VECTORS>(&source, tile);
                }
            }
        });
    let kernel_len = dims.rows();
    let mut weight_grad = zeroed(out_channels * kernel_len);
    weight_grad
        .par_chunks_mut(kernel_len)
        .enumerate()
        .for_each(|(o, row)| {
            let (block, lane) = (o / width, o % width);
            for (pair, taps) in row.chunks_exact_mut(COLUMNS).enumerate() {
                let tile = block * padded_tiles + pair / ROWS;
                let first = (tile * ROWS + pair % ROWS) * COLUMNS;
                for (j, value) in taps.iter_mut().enumerate() {
                    *value = sums[(first + j) * width + lane];
                }
            }
        });
    weight_grad
}

/// `grad` `[N, Cout, P]` as `[Cout/width, N·P, width]`.
fn packed_grad(
    grad: &[f32],
    batch: usize,
    out_channels: usize,
    positions: usize,
    width: usize,
) -> Vec<f32> {
    let mut packed = zeroed(out_channels * batch * positions);
    // One (block, image) per piece: `[positions, width]`, from `width` contiguous planes.
    packed
        .par_chunks_mut(positions * width)
        .enumerate()
        .for_each(|(piece, dst)| {
            let (block, b) = (piece / batch, piece % batch);
            let first = b * out_channels + block * width;
            tile::interleave(&grad[first * positions..][..width * positions], width, dst);
        });
    packed
}
