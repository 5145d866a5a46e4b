//! Which algorithm computes each pass of a convolution: the one place the paths are chosen,
//! with the thresholds measured for them, and [`conv_path`] to ask which path a shape takes.
//!
//! Each algorithm's own `applies` says where it is correct (and, for Winograd's, where it
//! is worth its transforms); the order and the thresholds here say which of those that apply
//! is fastest, from the measurements quoted on each.

use crate::conv::dims::ConvDims;
use crate::conv::flex::transposed_dims;
use crate::conv::geometry::ConvGeometry;
use crate::conv::winograd::{f2, f4};
use crate::conv::{direct, shifted};
use crate::isa::Isa;

/// An algorithm for one pass of a convolution on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPath {
    /// Winograd's F(4×4, 3×3): 3×3 unit-stride kernels on planes large enough for its tiles.
    Winograd4,
    /// Winograd's F(2×2, 3×3).
    Winograd2,
    /// The direct kernel: register tiles over the input, with the taps over padding skipped.
    Direct,
    /// One GEMM per kernel tap over shifted views of the input (no im2col copy).
    Shifted,
    /// im2col (or col2im for a strided input gradient) and one GEMM per block of images.
    Im2col,
}

/// A pass of a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPass {
    /// The output from the input and the weight.
    Forward,
    /// The input's gradient from the output's.
    InputGradient,
    /// The weight's gradient from the input and the output's gradient.
    WeightGradient,
}

/// Largest kernel volume (`Cin·kh·kw`) for which the direct kernel is taken where Winograd's
/// F(4×4) is not: measured (one thread, batch 32) 0.64–0.72× the best other path's time at
/// 32–128 channels (3×3 on 16×16 to 4×4); at 256 channels 8×8 F(2×2) stays ahead (17.4
/// against 19.6 ms on a Zen 4 EPYC, with the edge taps skipped), and with stride 2 im2col.
const DIRECT_MAX_ROWS: usize = 1152;

/// Largest output plane on which the direct kernel is taken at any kernel volume (with
/// AVX-512): on 4×4 it leaves out the taps over padding on all four edges (31 % of a 3×3
/// kernel's multiply-adds), which no GEMM formulation does. 512 channels 4×4, one thread,
/// batch 32, Zen 4 EPYC: 20.4 ms against F(2×2) 23.8 and im2col 24.2 (before the left and
/// right edges were skipped, 25.2 against 24.8).
const DIRECT_ANY_ROWS_MAX_POSITIONS: usize = 16;

/// Most channel pairs (`Cin·Cout`) for which the direct weight gradient goes ahead of every
/// other path: measured (one thread, batch 32, 3×3) 0.77–0.81× the best other path's time at
/// 16–64 channels (32×32 to 8×8); from 128 channels F(2×2) or the shifted GEMMs were faster
/// where they apply (1.14× at 128 channels 4×4, 1.5× at 64 channels 32×32). Where neither
/// applies (small planes with many channels, strides, 1×1 kernels) it still goes ahead of
/// im2col (0.85× at 512 channels 4×4).
const DIRECT_FIRST_MAX_PAIRS: usize = 64 * 64;

/// Fewest input channels for the direct weight gradient: with 3 (an RGB stem) a tile of
/// (channel, kernel row) pairs is mostly empty and it took 2.3× im2col's time.
const DIRECT_MIN_CHANNELS: usize = 16;

/// Whether the forward of `dims` takes the direct kernel where Winograd's F(4×4) did not.
/// On AVX2 (the tile in register blocks, at half AVX-512's width, computing the skipped
/// taps) F(2×2) stayed ahead at unit stride from 64 input channels on planes of 8×8 and
/// more: measured with gemm's AVX2 kernels (`KILN_MAX_ISA=avx2`, one thread) 2.35 against
/// 1.98 ms at 64 channels 8×8, while at 4×4, strided and with fewer channels the direct
/// kernel stayed 0.5–0.9× the other paths.
fn direct_forward_fits(dims: &ConvDims) -> bool {
    let avx512 = Isa::current() == Isa::Avx512;
    let wide_unit_stride =
        dims.geometry.stride == [1, 1] && dims.channels >= 64 && dims.positions() >= 64;
    let small_plane = avx512 && dims.positions() <= DIRECT_ANY_ROWS_MAX_POSITIONS;
    (dims.rows() <= DIRECT_MAX_ROWS || small_plane) && (avx512 || !wide_unit_stride)
}

/// The forward's path for `dims` with `out_channels` outputs.
pub(crate) fn forward_path(dims: &ConvDims, out_channels: usize) -> ConvPath {
    if f4::applies(dims, out_channels) {
        ConvPath::Winograd4
    } else if direct::forward::applies(dims, out_channels) && direct_forward_fits(dims) {
        ConvPath::Direct
    } else if shifted::applies(dims) {
        // Where F(4×4) does not apply, the shifted GEMMs were as fast as F(2×2) or faster
        // (0.76× at 32 channels 16×16); F(2×2) keeps the planes too small for them (8×8).
        ConvPath::Shifted
    } else if f2::applies(dims, out_channels) {
        ConvPath::Winograd2
    } else {
        ConvPath::Im2col
    }
}

/// The input gradient's path: for unit strides the forward's path of the transposed
/// convolution, else col2im.
pub(crate) fn input_gradient_path(dims: &ConvDims, out_channels: usize) -> ConvPath {
    match transposed_dims(dims, out_channels) {
        Some(transposed) => forward_path(&transposed, dims.channels),
        None => ConvPath::Im2col,
    }
}

/// The weight gradient's path for `dims` with `out_channels` outputs.
pub(crate) fn weight_gradient_path(dims: &ConvDims, out_channels: usize) -> ConvPath {
    let direct = direct::weight_gradient::applies(dims, out_channels)
        && dims.channels >= DIRECT_MIN_CHANNELS;
    if direct && dims.channels * out_channels <= DIRECT_FIRST_MAX_PAIRS {
        ConvPath::Direct
    } else if f2::applies_to_weight_gradient(dims, out_channels) {
        ConvPath::Winograd2
    } else if shifted::applies(dims) {
        ConvPath::Shifted
    } else if direct {
        ConvPath::Direct
    } else {
        ConvPath::Im2col
    }
}

/// The path kiln's CPU kernel takes for `pass` of a convolution of an input
/// `[N, Cin, H, W]` with a weight `[Cout, Cin, kh, kw]` under `geometry`, on this CPU (the
/// direct kernel's choice depends on its vector width); `None` when the shapes make no
/// convolution (the channels differ, or the padded input is smaller than the kernel).
///
/// ```
/// use kiln_kernels::{ConvGeometry, ConvPass, ConvPath, conv_path};
///
/// let same = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
/// let path = conv_path(ConvPass::Forward, [32, 64, 32, 32], [64, 64, 3, 3], same);
/// assert_eq!(path, Some(ConvPath::Winograd4));
/// assert_eq!(conv_path(ConvPass::Forward, [1, 3, 8, 8], [4, 5, 3, 3], same), None);
/// ```
pub fn conv_path(
    pass: ConvPass,
    input: [usize; 4],
    weight: [usize; 4],
    geometry: ConvGeometry,
) -> Option<ConvPath> {
    let [_, channels, height, width] = input;
    let [out_channels, in_channels, kh, kw] = weight;
    if channels != in_channels || channels == 0 || out_channels == 0 {
        return None;
    }
    let output = geometry.output_size([height, width], [kh, kw])?;
    let dims = ConvDims {
        channels,
        input: [height, width],
        kernel: [kh, kw],
        output,
        geometry,
    };
    Some(match pass {
        ConvPass::Forward => forward_path(&dims, out_channels),
        ConvPass::InputGradient => input_gradient_path(&dims, out_channels),
        ConvPass::WeightGradient => weight_gradient_path(&dims, out_channels),
    })
}

#[cfg(test)]
mod tests {
    use super::{ConvPass, ConvPath, conv_path};
    use crate::conv::geometry::ConvGeometry;

    fn padded(stride: usize, pad: usize) -> ConvGeometry {
        ConvGeometry::new()
            .with_stride([stride, stride])
            .with_padding([(pad, pad), (pad, pad)])
    }

    // Facts of the algorithms, true on every CPU (the direct kernel's choice is not).
    #[test]
    fn each_shape_gets_a_path_its_algorithm_can_run() {
        let passes = [
            ConvPass::Forward,
            ConvPass::InputGradient,
            ConvPass::WeightGradient,
        ];
        // ResNet-18's CIFAR convolutions at width 16, batch 32.
        #[rustfmt::skip]
        let shapes = [
            (3, 16, 32, 3, 1), (16, 16, 32, 3, 1), (16, 32, 32, 3, 2), (32, 32, 16, 3, 1),
            (16, 32, 32, 1, 2), (64, 64, 8, 3, 1), (128, 128, 4, 3, 1), (64, 128, 8, 1, 2),
        ];
        for (cin, cout, size, k, stride) in shapes {
            let geometry = padded(stride, k / 2);
            for pass in passes {
                let path = conv_path(pass, [32, cin, size, size], [cout, cin, k, k], geometry)
                    .expect("a convolution");
                if stride != 1 || k != 3 {
                    // Winograd's transforms are for unit-stride 3×3 kernels only.
                    assert!(
                        !matches!(path, ConvPath::Winograd4 | ConvPath::Winograd2),
                        "{pass:?} of {cin}->{cout} {k}x{k}/{stride}: {path:?}"
                    );
                }
                if stride != 1 {
                    assert_ne!(
                        path,
                        ConvPath::Shifted,
                        "the shifted GEMMs need unit stride"
                    );
                }
            }
            if stride != 1 {
                // A strided input gradient has no transposed-convolution form: col2im.
                let path = conv_path(
                    ConvPass::InputGradient,
                    [32, cin, size, size],
                    [cout, cin, k, k],
                    geometry,
                );
                assert_eq!(path, Some(ConvPath::Im2col));
            }
        }
        // The RGB stem's weight gradient never takes the direct kernel (mostly empty tiles).
        let stem = conv_path(
            ConvPass::WeightGradient,
            [32, 3, 32, 32],
            [16, 3, 3, 3],
            padded(1, 1),
        );
        assert_ne!(stem, Some(ConvPath::Direct));
    }

    #[test]
    fn shapes_that_make_no_convolution_have_no_path() {
        let geometry = padded(1, 0);
        let forward = ConvPass::Forward;
        assert_eq!(
            conv_path(forward, [1, 3, 8, 8], [4, 5, 3, 3], geometry),
            None
        );
        assert_eq!(
            conv_path(forward, [1, 3, 2, 2], [4, 3, 3, 3], geometry),
            None
        );
        assert_eq!(
            conv_path(forward, [1, 0, 8, 8], [4, 0, 3, 3], geometry),
            None
        );
        assert!(conv_path(forward, [1, 3, 3, 3], [4, 3, 3, 3], geometry).is_some());
    }
}
