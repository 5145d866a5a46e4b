//! The direct convolution: each output tile (3 rows × 4 columns × 32 channels) summed in
//! registers over every input channel and tap, reading the zero-padded input in place
//! (`direct/tile.rs`), the way oneDNN's direct kernels work, without im2col's column matrix.
//!
//! im2col + GEMM writes `Cin·kh·kw` copies of every input value and the GEMM packs them once
//! more; on small planes (8×8, 4×4) and strided layers that data movement cost as much as
//! the multiply-adds. Here the only copies are the padded input (once per convolution) and
//! the weights, packed once as `[Cout/32, Cin·kh·kw, 32]`. Each output element is one tile's
//! sum over the kernel in a fixed order, so results do not depend on the thread count.
//!
//! On small planes (8×8 and less) a tile takes one output row of three images, and at the
//! top and bottom edges it skips the kernel rows that read only padding (zeros, which add
//! nothing): a sixth of a 4×4 output's multiply-adds, as oneDNN's kernels skip them. The
//! kernel's steps then run kernel row by kernel row within blocks of 32 channels, so the
//! skipped steps leave one run per block. Measured (one thread, batch 32, fastest of 6
//! interleaved rounds): 128 channels 4×4 1.07 → 0.97 ms, 512 channels 4×4 20.1 → 18.0,
//! 256 channels 8×8 16.8 → 16.0, 64 channels 8×8 1.05 → 1.04; 16×16 unchanged (1.21).
//!
//! On every plane, a tile at the left or right edge also leaves out the kernel column that
//! reads only padding from its first or last column (`direct_conv_edges.rs`,
//! `tile::ColumnSkip`; 3×3
//! kernels). On a 4×4 output both edges together with the rows leave out 31 % of the
//! multiply-adds. Measured (one thread, batch 32, Zen 4 EPYC): 128 channels 4×4 1.45 →
//! 1.14 ms, 64 channels 8×8 1.62 → 1.25, 512 channels 4×4 25.2 → 20.4 (now ahead of im2col's
//! 24.2, so taken there).

use std::borrow::Cow;
use std::ops::Range;

use rayon::prelude::*;

use crate::conv::dims::ConvDims;
use crate::conv::direct::edges::{kernel_rows_reading_input, padding_columns};
use crate::conv::direct::rows::{PartOutput, RowOrder, share_rows};
use crate::conv::direct::tile::{
    self, ColumnSkip, Steps, TILE_CHANNELS, TILE_COLUMNS, TILE_POSITIONS, TILE_ROWS, Tile,
    TileSource,
};
use crate::short_copy::copy_short;
use crate::zeroed::zeroed;

/// Images per parallel piece: tiles take their three rows across the piece's images, so
/// with three images no tile is partly empty where an image's height is not a multiple of 3.
const GROUP_IMAGES: usize = 3;

/// Values in one tile's sums.
const TILE_LEN: usize = TILE_POSITIONS * TILE_CHANNELS;

/// Whether the direct kernel can compute this convolution: output channels a multiple of
/// 32, the same stride of 1 or 2 both ways, an output width that is a multiple of 4.
pub(crate) fn shape_fits(dims: &ConvDims, out_channels: usize) -> bool {
    let stride = dims.geometry.stride;
    out_channels > 0
        && out_channels.is_multiple_of(TILE_CHANNELS)
        && stride[0] == stride[1]
        && (1..=2).contains(&stride[0])
        && dims.output[0] > 0
        && dims.output[1] > 0
        && dims.output[1].is_multiple_of(TILE_COLUMNS)
}

/// Whether the forward of `dims` takes this path: where it fits and the CPU runs its
/// AVX-512 tile.
pub(crate) fn applies(dims: &ConvDims, out_channels: usize) -> bool {
    tile::fast() && shape_fits(dims, out_channels)
}

/// `x` `[N, Cin, H, W]` convolved with `weight` `[Cout, Cin·kh·kw]`: `[N, Cout, Ho, Wo]`.
///
/// # Panics
///
/// If the shape does not fit ([`shape_fits`]) or a slice is shorter than its shape.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    assert!(shape_fits(dims, out_channels), "direct convolution: shape");
    assert!(x.len() >= batch * dims.image_len());
    assert!(weight.len() >= out_channels * dims.rows());
    match dims.geometry.stride[0] {
        1 => forward_with::<1>(x, weight, dims, batch, out_channels),
        _ => forward_with::<2>(x, weight, dims, batch, out_channels),
    }
}

fn forward_with<const STRIDE: usize>(
    x: &[f32],
    weight: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let (input, [padded_h, padded_w]) = padded(x, dims, batch);
    let plane = padded_h * padded_w;
    let image = dims.channels * plane;
    let dilation = dims.geometry.dilation;
    let [out_h, out_w] = dims.output;
    let across_images = skips_kernel_rows(out_h);
    let step_order = StepOrder::new(dims, across_images);
    let order_of_rows = step_order.kernel_rows();
    let taps: Vec<usize> = order_of_rows
        .iter()
        .map(|&k| {
            let (channel, i, j) = dims.tap(k);
            channel * plane + i * dilation[0] * padded_w + j * dilation[1]
        })
        .collect();
    let steps = Steps::new(&taps);
    let weights = packed_weights(weight, out_channels, &order_of_rows);
    let kernel_rows = kernel_rows_reading_input(dims);
    let column_skips = padding_columns(dims);
    let positions = out_h * out_w;
    let mut output = zeroed(batch * out_channels * positions);
    let blocks = out_channels / TILE_CHANNELS;
    let pieces = batch.div_ceil(GROUP_IMAGES) * blocks;
    output
        .par_chunks_mut(GROUP_IMAGES * out_channels * positions)
        .enumerate()
        .for_each(|(group, out)| {
            let first = group * GROUP_IMAGES;
            let order = RowOrder {
                images: out.len() / (out_channels * positions),
                height: out_h,
                across_images,
            };
            let parts = part_rows(order.rows(), pieces);
            // Each 32-channel block of the piece's images is its own task, and its tile rows
            // are shared among `parts`: the block's output is one slice per image, of which
            // each part holds the rows it writes.
            let mut per_block: Vec<Vec<&mut [f32]>> = (0..blocks).map(|_| Vec::new()).collect();
            for image_out in out.chunks_mut(out_channels * positions) {
                for (slices, block_out) in per_block
                    .iter_mut()
                    .zip(image_out.chunks_mut(TILE_CHANNELS * positions))
                {
                    slices.push(block_out);
                }
            }
            let tasks: Vec<_> = per_block
                .into_iter()
                .zip(weights.chunks_exact(dims.rows() * TILE_CHANNELS))
                .flat_map(|(block_out, block_weights)| {
                    share_rows(block_out, order, &parts, out_w)
                        .into_iter()
                        .zip(parts.iter().cloned())
                        .map(move |(part_out, rows)| (part_out, rows, block_weights))
                })
                .collect();
            tasks
                .into_par_iter()
                .for_each(|(mut part_out, rows, block_weights)| {
                    let piece = Piece {
                        input: &input,
                        steps,
                        step_order,
                        row_order: order,
                        kernel_rows: &kernel_rows,
                        column_skips: &column_skips,
                        first_offset: first * image,
                        image,
                        padded_w,
                        out_w,
                    };
                    piece.compute::<STRIDE>(block_weights, rows, &mut part_out);
                });
        });
    output
}

/// One piece of the forward: output rows of a few images for one 32-channel block.
struct Piece<'a> {
    /// The padded input.
    input: &'a [f32],
    /// Offset of each step (in `step_order`) from a window's corner.
    steps: Steps<'a>,
    /// The order of the steps.
    step_order: StepOrder,
    /// The order of the piece's output rows.
    row_order: RowOrder,
    /// For each output row, the kernel rows that read its input rather than padding.
    kernel_rows: &'a [Range<usize>],
    /// For each tile column, the taps at its edges that read padding.
    column_skips: &'a [ColumnSkip],
    /// Offset of the piece's first image in `input`.
    first_offset: usize,
    /// Elements of one padded image.
    image: usize,
    /// Padded input width.
    padded_w: usize,
    /// Output width.
    out_w: usize,
}

impl Piece<'_> {
    /// Sums the tiles of the piece's rows `rows` (in `row_order`, from a multiple of
    /// [`TILE_ROWS`]) against `weights` (`[K, 32]`) into `out`.
    fn compute<const STRIDE: usize>(
        &self,
        weights: &[f32],
        rows: Range<usize>,
        out: &mut PartOutput<'_>,
    ) {
        let out_w = self.out_w;
        let last = self.row_order.rows() - 1;
        let mut tile: Tile = [0.0; TILE_LEN];
        for r0 in rows.clone().step_by(TILE_ROWS) {
            // A last tile past the piece's rows repeats its last row, not stored.
            let tile_rows: [(usize, usize); TILE_ROWS] =
                std::array::from_fn(|t| self.row_order.at((r0 + t).min(last)));
            let offsets = tile_rows.map(|(slot, oh)| {
                self.first_offset + slot * self.image + oh * STRIDE * self.padded_w
            });
            // The kernel rows any of the tile's rows reads from its input: the others read
            // only padding (zeros) for every one of them, adding nothing.
            let kernel_rows = tile_rows
                .iter()
                .map(|&(_, oh)| self.kernel_rows[oh].clone())
                .filter(|range| !range.is_empty())
                .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
                .unwrap_or(0..0);
            for (ow0, &skip) in (0..out_w).step_by(TILE_COLUMNS).zip(self.column_skips) {
                let tile_offsets = offsets.map(|o| o + ow0 * STRIDE);
                tile.fill(0.0);
                for steps in self.step_order.runs(kernel_rows.clone()) {
                    let source = TileSource {
                        input: self.input,
                        rows: tile_offsets,
                        steps: self.steps.part(steps.clone()),
                        operand: &weights[steps.start * TILE_CHANNELS..steps.end * TILE_CHANNELS],
                        skip,
                    };
                    tile::accumulate::<TILE_ROWS, TILE_COLUMNS, STRIDE, 2>(&source, &mut tile);
                }
                for (t, &(slot, oh)) in tile_rows.iter().enumerate().take(rows.end - r0) {
                    let (first, planes) = out.image(slot);
                    for (o, plane) in planes.iter_mut().enumerate() {
                        let dst = &mut plane[(oh - first) * out_w + ow0..][..TILE_COLUMNS];
                        for (c, d) in dst.iter_mut().enumerate() {
                            *d = tile[(t * TILE_COLUMNS + c) * TILE_CHANNELS + o];
                        }
                    }
                }
            }
        }
    }
}

/// The rows of a piece of `rows` rows shared out among parallel parts (whole tiles each): one
/// part where `pieces` (the pieces of the whole convolution) keep every thread of the pool
/// busy to the end, more where they are few (11 pieces of 3 images for a batch of 32 and one
/// block: the last left a thread idle for up to a piece).
fn part_rows(rows: usize, pieces: usize) -> Vec<Range<usize>> {
    const TASKS_PER_THREAD: usize = 8;
    let wanted = (TASKS_PER_THREAD * rayon::current_num_threads()).div_ceil(pieces.max(1));
    let tiles = rows.div_ceil(TILE_ROWS);
    let per_part = tiles.div_ceil(wanted.clamp(1, tiles.max(1))) * TILE_ROWS;
    (0..rows)
        .step_by(per_part.max(TILE_ROWS))
        .map(|start| start..rows.min(start + per_part))
        .collect()
}

/// `x` with its padding written out as zeros: `[N, Cin, Hp, Wp]` and `[Hp, Wp]` (`x` itself
/// when there is no padding).
pub(crate) fn padded<'a>(
    x: &'a [f32],
    dims: &ConvDims,
    batch: usize,
) -> (Cow<'a, [f32]>, [usize; 2]) {
    let [(top, bottom), (left, right)] = dims.geometry.padding;
    let [height, width] = dims.input;
    let size = [height + top + bottom, width + left + right];
    let planes = batch * dims.channels;
    if top + bottom + left + right == 0 {
        return (Cow::Borrowed(&x[..planes * height * width]), size);
    }
    let mut padded = zeroed(planes * size[0] * size[1]);
    padded
        .par_chunks_mut(size[0] * size[1])
        .zip(x.par_chunks(height * width))
        .for_each(|(dst, src)| {
            for (row, line) in src.chunks_exact(width).enumerate() {
                copy_short(&mut dst[(top + row) * size[1] + left..][..width], line);
            }
        });
    (Cow::Owned(padded), size)
}

/// Tallest output whose tiles take one row of each of three images rather than three rows of
/// one image.
const ACROSS_IMAGES_MAX_HEIGHT: usize = 8;

/// Whether the tiles of an output `height` rows tall take one row of each of three images,
/// and so skip the kernel rows that read only padding at its top and bottom edges.
fn skips_kernel_rows(height: usize) -> bool {
    height <= ACROSS_IMAGES_MAX_HEIGHT
}

/// Input channels per block of [`StepOrder`]: a block's padded planes (of three images,
/// 4×4 to 8×8) stay in the L1 cache while a tile steps through its kernel rows. With every
/// channel in one block, 512 channels at 4×4 ran 10 % slower.
const CHANNEL_BLOCK: usize = 32;

/// The order in which a tile steps through the kernel's `Cin·kh·kw` (channel, kernel row,
/// kernel column) rows: blocks of channels, in each kernel row, then channel, then kernel
/// column. With blocks of [`CHANNEL_BLOCK`] the steps of the kernel rows that an output row
/// reads from its input (not its padding) are one run per block; with blocks of one channel
/// this is the kernel's own order, each channel's taps together.
#[derive(Clone, Copy, Debug)]
struct StepOrder {
    channels: usize,
    kernel: [usize; 2],
    block: usize,
}

impl StepOrder {
    /// Blocks of [`CHANNEL_BLOCK`] channels where tiles skip kernel rows (`skipping`), else
    /// the kernel's own order.
    fn new(dims: &ConvDims, skipping: bool) -> Self {
        Self {
            channels: dims.channels,
            kernel: dims.kernel,
            block: if skipping { CHANNEL_BLOCK } else { 1 },
        }
    }

    /// The kernel's rows (`(c·kh + i)·kw + j`) in step order.
    fn kernel_rows(&self) -> Vec<usize> {
        let [kernel_h, kernel_w] = self.kernel;
        (0..self.channels)
            .step_by(self.block)
            .flat_map(|first| {
                let block = first..self.channels.min(first + self.block);
                (0..kernel_h).flat_map(move |i| {
                    block.clone().flat_map(move |c| {
                        (0..kernel_w).map(move |j| (c * kernel_h + i) * kernel_w + j)
                    })
                })
            })
            .collect()
    }

    /// The runs of steps of kernel rows `rows`: all steps in one run when `rows` are all the
    /// kernel's, else one run per block.
    fn runs(&self, rows: Range<usize>) -> impl Iterator<Item = Range<usize>> {
        let [kernel_h, kernel_w] = self.kernel;
        let whole = rows == (0..kernel_h);
        let (blocks, block) = match (rows.is_empty(), whole) {
            (true, _) => (0, 1),
            (false, true) => (1, self.channels),
            (false, false) => (self.channels, self.block),
        };
        (0..blocks).step_by(block).map(move |first| {
            let per_row = self.channels.min(first + block) - first;
            let start = first * kernel_h * kernel_w;
            start + rows.start * per_row * kernel_w..start + rows.end * per_row * kernel_w
        })
    }
}

/// `weight` `[Cout, K]` as `[Cout/32, K, 32]` with `K` in `order`: each step of a tile reads
/// its 32 channels' weights as two contiguous vectors.
fn packed_weights(weight: &[f32], out_channels: usize, order: &[usize]) -> Vec<f32> {
    let k = order.len();
    let mut packed = zeroed(out_channels * k);
    packed
        .par_chunks_mut(k * TILE_CHANNELS)
        .zip(weight.par_chunks_exact(k * TILE_CHANNELS))
        .for_each(|(dst, rows)| tile::interleave_in_order(rows, TILE_CHANNELS, order, dst));
    packed
}

#[cfg(test)]
mod tests {
    use super::StepOrder;
    use crate::conv::geometry::ConvGeometry;
    use crate::test_support::conv_dims as dims;

    #[test]
    fn runs_cover_the_kernel_rows_of_every_block() {
        let d = dims(40, [4, 4], [3, 3], ConvGeometry::new());
        let order = StepOrder::new(&d, true);
        let rows = order.kernel_rows();
        // Blocks of 32 and 8 channels, each kernel row by kernel row.
        assert_eq!(rows[..3], [0, 1, 2]);
        assert_eq!(rows[3..6], [9, 10, 11]);
        assert_eq!(rows[32 * 3], 3);
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..40 * 9).collect::<Vec<_>>());
        // The steps of kernel rows 1..3: rows 1 and 2 of each block, in order.
        let runs: Vec<_> = order.runs(1..3).collect();
        assert_eq!(runs, [96..288, 288 + 24..360]);
        for run in runs {
            assert!(rows[run].iter().all(|&k| (k / 3) % 3 != 0));
        }
        let whole: Vec<_> = order.runs(0..3).collect();
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0], 0..360);
        assert_eq!(order.runs(0..0).count(), 0);
        // Without skipping: the kernel's own order.
        let plain = StepOrder::new(&d, false);
        assert_eq!(plain.kernel_rows(), (0..360).collect::<Vec<_>>());
    }
}
