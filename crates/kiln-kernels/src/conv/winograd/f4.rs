//! Winograd F(4×4, 3×3) for the forward convolution (and so the unit-stride input gradient,
//! a forward with the flipped kernel) of larger images: 36 multiply-adds per 4×4 output
//! tile and channel pair where F(2×2, 3×3) spends 64 (four 2×2 tiles of 16) and im2col 144.
//!
//! Each 4×4 output tile is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` of its 6×6 input tile `d`, with the
//! interpolation points 0, ±1, ±2 (Lavin and Gray, 2016); summed over the input channels the
//! element-wise products are 36 GEMMs per block of images, `U[ξ] [Cout, Cin] × V[ξ] [Cin,
//! tiles]`. Unlike F(2×2, 3×3), whose coefficients are 0, ±1 and ½, these transforms scale by
//! up to 8 and by ¼, ⅙, 1⁄12 and 1⁄24, so results differ from im2col's by more rounding
//! (5e-6–1.5e-5 of the largest output at ResNet's shapes; `winograd4_tests` holds it to 3e-5);
//! the weight gradient, whose errors would compound in the optimizer's state, stays on F(2×2,
//! 3×3). Blocks, tiles and summation orders follow the shapes, never the thread count.

use std::ops::Range;

use crate::conv::dims::ConvDims;
use crate::conv::winograd::f2::{forward_blocks, shape_fits, transform_kernel};
use crate::conv::winograd::f4_tiles::{
    LANES, POINTS, input_1d, output_1d, transform_input, transform_output,
};
use crate::conv::winograd::images;
use crate::conv::winograd::tiles::Tiling;

/// Tiles a block's GEMMs should see at least (the column count of each of its 36 GEMMs).
const BLOCK_TILES: usize = 64;

/// Images a block of narrow images holds, so that their transforms run across the images
/// ([`images`](crate::conv::winograd::images)): one vector's worth.
const BATCHED_IMAGES: usize = LANES;

/// Whether a block of `images` images of `tiling` transforms across its images: tile rows
/// under 8 tiles (at a 16×16 output a plane's runs are 4 tiles, and the plane-wise input
/// transform ran 2.3× longer than across 16 images) and a whole vector of images.
fn across_images(tiling: Tiling, images: usize) -> bool {
    tiling.cols < 8 && images >= LANES
}

/// Smallest output height and width that takes this path.
pub(crate) const MIN_OUTPUT: usize = 16;

/// Outputs narrower than this (planes of under 8 tiles a row) take this path only from
/// [`NARROW_MIN_CHANNELS`] channels.
pub(crate) const WIDE_OUTPUT: usize = 32;

/// Fewest input and output channels for this path at outputs from [`MIN_OUTPUT`] up to
/// [`WIDE_OUTPUT`]: measured at 16×16 (one thread, batch 32, freed memory kept), the shifted
/// GEMMs ran 0.75× its time at 32 channels and 0.92× at 48, this path 0.93× theirs at 64.
pub(crate) const NARROW_MIN_CHANNELS: usize = 64;

/// Whether the forward convolution of `dims` with `out_channels` outputs takes this path: the
/// shapes F(2×2, 3×3) takes (a 3×3 kernel, unit stride and dilation, enough channels), with
/// an output of at least [`MIN_OUTPUT`] in both dimensions, and at least
/// [`NARROW_MIN_CHANNELS`] channels each side below [`WIDE_OUTPUT`].
pub(crate) fn applies(dims: &ConvDims, out_channels: usize) -> bool {
    let side = dims.output[0].min(dims.output[1]);
    let channels = dims.channels.min(out_channels);
    shape_fits(dims, out_channels)
        && side >= MIN_OUTPUT
        && (side >= WIDE_OUTPUT || channels >= NARROW_MIN_CHANNELS)
}

/// `G v` for a column or row of a kernel: `v0/4`, `−(v0 ± v1 + v2)/6`,
/// `(v0 ± 2v1 + 4v2)/24`, `v2`.
#[inline(always)]
fn kernel_1d(v: [f32; 3]) -> [f32; 6] {
    let (outer, inner) = (v[0] + v[2], v[0] + 4.0 * v[2]);
    [
        0.25 * v[0],
        -(outer + v[1]) / 6.0,
        -(outer - v[1]) / 6.0,
        (inner + 2.0 * v[1]) / 24.0,
        (inner - 2.0 * v[1]) / 24.0,
        v[2],
    ]
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
    let tiling = Tiling::with_side(dims, 4);
    let u = transform_kernel(weight, dims.channels, out_channels, kernel_1d);
    let mut size = BLOCK_TILES.div_ceil(tiling.per_image().max(1)).max(1);
    if across_images(tiling, batch.min(BATCHED_IMAGES)) {
        size = size.max(BATCHED_IMAGES);
    }
    let batched = |images: &Range<usize>| across_images(tiling, images.len());
    forward_blocks(
        dims,
        (batch, out_channels),
        (tiling, size),
        (POINTS, &u),
        |images, v| {
            if batched(&images) {
                images::transform_input::<6>(x, dims, tiling, images, v, input_1d);
            } else {
                transform_input(x, dims, tiling, images, v);
            }
        },
        |m, images, out| {
            let tiles = images.len() * tiling.per_image();
            if batched(&images) {
                images::transform_output::<6, 4>(
                    m,
                    dims,
                    tiling,
                    out_channels,
                    tiles,
                    out,
                    output_1d,
                );
            } else {
                transform_output(m, dims, tiling, out_channels, tiles, out);
            }
        },
    )
}
