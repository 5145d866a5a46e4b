//! The direct convolution: each output tile (3 rows × 4 columns × 32 channels) summed in
//! registers over every input channel and tap, reading the zero-padded input in place
//! (`direct_tile`), the way oneDNN's direct kernels work, without im2col's column matrix.
//!
//! im2col + GEMM writes `Cin·kh·kw` copies of every input value and the GEMM packs them once
//! more; on small planes (8×8, 4×4) and strided layers that data movement cost as much as
//! the multiply-adds. Here the only copies are the padded input (once per convolution) and
//! the weights, packed once as `[Cout/32, Cin·kh·kw, 32]`. Each output element is one tile's
//! sum over the kernel in a fixed order, so results do not depend on the thread count.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::direct_tile::{
    self, Steps, TILE_CHANNELS, TILE_COLUMNS, TILE_POSITIONS, TILE_ROWS, Tile, TileSource,
};
use crate::im2col::ConvDims;
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
    direct_tile::fast() && shape_fits(dims, out_channels)
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
    let taps: Vec<usize> = (0..dims.rows())
        .map(|k| {
            let (channel, i, j) = dims.tap(k);
            channel * plane + i * dilation[0] * padded_w + j * dilation[1]
        })
        .collect();
    let steps = Steps::new(&taps);
    let weights = packed_weights(weight, out_channels, dims.rows());
    let [out_h, out_w] = dims.output;
    let positions = out_h * out_w;
    let mut output = zeroed(batch * out_channels * positions);
    output
        .par_chunks_mut(GROUP_IMAGES * out_channels * positions)
        .enumerate()
        .for_each(|(group, out)| {
            let first = group * GROUP_IMAGES;
            let rows = out.len() / (out_channels * positions) * out_h;
            // Each 32-channel block of the piece's images is its own task: the block's output
            // is one slice per image.
            let blocks = out_channels / TILE_CHANNELS;
            let mut per_block: Vec<Vec<&mut [f32]>> = (0..blocks).map(|_| Vec::new()).collect();
            for image_out in out.chunks_mut(out_channels * positions) {
                for (slices, block_out) in per_block
                    .iter_mut()
                    .zip(image_out.chunks_mut(TILE_CHANNELS * positions))
                {
                    slices.push(block_out);
                }
            }
            per_block
                .into_par_iter()
                .zip(weights.par_chunks_exact(dims.rows() * TILE_CHANNELS))
                .for_each(|(mut block_out, block_weights)| {
                    let piece = Piece {
                        input: &input,
                        steps,
                        first_offset: first * image,
                        image,
                        rows,
                        padded_w,
                        output: dims.output,
                    };
                    piece.compute::<STRIDE>(block_weights, &mut block_out);
                });
        });
    output
}

/// One piece of the forward: the output rows of a few images for one 32-channel block.
struct Piece<'a> {
    /// The padded input.
    input: &'a [f32],
    /// Offset of each (input channel, tap) from a window's corner.
    steps: Steps<'a>,
    /// Offset of the piece's first image in `input`.
    first_offset: usize,
    /// Elements of one padded image.
    image: usize,
    /// Output rows of the piece (its images' heights together).
    rows: usize,
    /// Padded input width.
    padded_w: usize,
    /// Output height and width.
    output: [usize; 2],
}

impl Piece<'_> {
    /// Sums every tile of the piece against `weights` (`[K, 32]`) into `out`, one
    /// `[32, Ho·Wo]` slice per image.
    fn compute<const STRIDE: usize>(&self, weights: &[f32], out: &mut [&mut [f32]]) {
        let [out_h, out_w] = self.output;
        let positions = out_h * out_w;
        let rows = self.rows;
        // Tile row `r` of this piece: (image within the piece, output row).
        let split = |r: usize| (r / out_h, r % out_h);
        let mut tile: Tile = [0.0; TILE_LEN];
        for r0 in (0..rows).step_by(TILE_ROWS) {
            // A last tile past the piece's rows repeats its last row, not stored.
            let offsets: [usize; TILE_ROWS] = std::array::from_fn(|t| {
                let (slot, oh) = split((r0 + t).min(rows - 1));
                self.first_offset + slot * self.image + oh * STRIDE * self.padded_w
            });
            for ow0 in (0..out_w).step_by(TILE_COLUMNS) {
                let source = TileSource {
                    input: self.input,
                    rows: offsets.map(|o| o + ow0 * STRIDE),
                    steps: self.steps,
                    operand: weights,
                };
                tile.fill(0.0);
                direct_tile::accumulate::<TILE_ROWS, TILE_COLUMNS, STRIDE, 2>(&source, &mut tile);
                for t in 0..TILE_ROWS.min(rows - r0) {
                    let (slot, oh) = split(r0 + t);
                    for (o, plane) in out[slot].chunks_exact_mut(positions).enumerate() {
                        let dst = &mut plane[oh * out_w + ow0..][..TILE_COLUMNS];
                        for (c, d) in dst.iter_mut().enumerate() {
                            *d = tile[(t * TILE_COLUMNS + c) * TILE_CHANNELS + o];
                        }
                    }
                }
            }
        }
    }
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

/// `weight` `[Cout, K]` as `[Cout/32, K, 32]`: each step of a tile reads its 32 channels'
/// weights as two contiguous vectors.
fn packed_weights(weight: &[f32], out_channels: usize, k: usize) -> Vec<f32> {
    let mut packed = zeroed(out_channels * k);
    packed
        .par_chunks_mut(k * TILE_CHANNELS)
        .zip(weight.par_chunks_exact(k * TILE_CHANNELS))
        .for_each(|(dst, rows)| direct_tile::interleave(rows, TILE_CHANNELS, dst));
    packed
}
