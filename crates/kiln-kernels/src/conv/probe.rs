//! Each algorithm of a convolution pass run on its own, for the benches that time them
//! against each other and against PyTorch (`cargo xtask bench --only kernels`): the
//! measurements behind [`conv_path`](crate::conv_path)'s thresholds.

use crate::conv::dims::ConvDims;
use crate::conv::flex::{
    flipped_weight, im2col_forward, im2col_weight_gradient, scattered_input_gradient,
    transposed_dims,
};
use crate::conv::geometry::ConvGeometry;
use crate::conv::path::{forward_path, input_gradient_path, weight_gradient_path};
use crate::conv::winograd::{f2, f4};
use crate::conv::{direct, shifted};
use crate::{ConvPass, ConvPath};

/// One convolution's shape with deterministic data, whose passes run by any algorithm that
/// can compute them.
///
/// ```
/// use kiln_kernels::{ConvGeometry, ConvPass, ConvPath, ConvProbe};
///
/// let same = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
/// let probe = ConvProbe::new([2, 16, 8, 8], [16, 16, 3, 3], same).unwrap();
/// let paths = probe.paths(ConvPass::Forward);
/// assert!(paths.contains(&ConvPath::Im2col) && paths.contains(&probe.chosen(ConvPass::Forward)));
/// // Every path computes the same convolution, to rounding.
/// let reference = probe.run(ConvPass::Forward, ConvPath::Im2col).unwrap();
/// for path in paths {
///     let out = probe.run(ConvPass::Forward, path).unwrap();
///     let worst = out.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
///     assert!(worst < 1e-3, "{path:?}: {worst}");
/// }
/// ```
pub struct ConvProbe {
    dims: ConvDims,
    batch: usize,
    out_channels: usize,
    input: Vec<f32>,
    weight: Vec<f32>,
    output_gradient: Vec<f32>,
}

impl ConvProbe {
    /// An input `[N, Cin, H, W]` and a weight `[Cout, Cin, kh, kw]` under `geometry`, filled
    /// with fixed pseudo-random values in [-1, 1); `None` when the shapes make no
    /// convolution (as [`conv_path`](crate::conv_path)).
    pub fn new(input: [usize; 4], weight: [usize; 4], geometry: ConvGeometry) -> Option<Self> {
        let [batch, channels, height, width] = input;
        let [out_channels, in_channels, kh, kw] = weight;
        if channels != in_channels || channels == 0 || out_channels == 0 || batch == 0 {
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
        Some(Self {
            input: values(batch * dims.image_len(), 1),
            weight: values(out_channels * dims.rows(), 2),
            output_gradient: values(batch * out_channels * dims.positions(), 3),
            dims,
            batch,
            out_channels,
        })
    }

    /// The path kiln takes for `pass` (what [`conv_path`](crate::conv_path) says).
    pub fn chosen(&self, pass: ConvPass) -> ConvPath {
        match pass {
            ConvPass::Forward => forward_path(&self.dims, self.out_channels),
            ConvPass::InputGradient => input_gradient_path(&self.dims, self.out_channels),
            ConvPass::WeightGradient => weight_gradient_path(&self.dims, self.out_channels),
        }
    }

    /// Every path that can compute `pass` of this shape on this CPU, chosen or not.
    pub fn paths(&self, pass: ConvPass) -> Vec<ConvPath> {
        let all = [
            ConvPath::Winograd4,
            ConvPath::Winograd2,
            ConvPath::Direct,
            ConvPath::Shifted,
            ConvPath::Im2col,
        ];
        all.into_iter()
            .filter(|&path| self.runs(pass, path))
            .collect()
    }

    /// Runs `pass` by `path`: the forward's output `[N, Cout, Ho, Wo]`, the input's
    /// gradient `[N, Cin, H, W]` or the weight's `[Cout, Cin·kh·kw]`; `None` where `path`
    /// cannot compute it (not among [`paths`](Self::paths)).
    pub fn run(&self, pass: ConvPass, path: ConvPath) -> Option<Vec<f32>> {
        if !self.runs(pass, path) {
            return None;
        }
        let (d, n, cout) = (&self.dims, self.batch, self.out_channels);
        let (x, w, g) = (&self.input, &self.weight, &self.output_gradient);
        Some(match pass {
            ConvPass::Forward => forward_by(path, x, w, d, n, cout),
            ConvPass::InputGradient => match transposed_dims(d, cout) {
                Some(transposed) => {
                    let flipped = flipped_weight(w, d, cout);
                    forward_by(path, g, &flipped, &transposed, n, d.channels)
                }
                None => scattered_input_gradient(w, g, d, n, cout),
            },
            ConvPass::WeightGradient => match path {
                ConvPath::Winograd2 => f2::weight_gradient(x, g, d, n, cout),
                ConvPath::Shifted => shifted::weight_gradient(x, g, d, n, cout),
                ConvPath::Direct => direct::weight_gradient::weight_gradient(x, g, d, n, cout),
                ConvPath::Winograd4 | ConvPath::Im2col => im2col_weight_gradient(x, g, d, n, cout),
            },
        })
    }

    /// Whether `path` can compute `pass` of this shape.
    fn runs(&self, pass: ConvPass, path: ConvPath) -> bool {
        let (d, cout) = (&self.dims, self.out_channels);
        match pass {
            ConvPass::Forward => forward_runs(path, d, cout),
            ConvPass::InputGradient => match transposed_dims(d, cout) {
                Some(transposed) => forward_runs(path, &transposed, d.channels),
                None => path == ConvPath::Im2col,
            },
            ConvPass::WeightGradient => match path {
                ConvPath::Winograd4 => false,
                ConvPath::Winograd2 => f2::shape_fits(d, cout),
                ConvPath::Shifted => shifted::applies(d),
                ConvPath::Direct => direct::weight_gradient::applies(d, cout),
                ConvPath::Im2col => true,
            },
        }
    }
}

/// Whether the forward of `dims` can run by `path` (F(4×4) needs outputs of 4×4 or more).
fn forward_runs(path: ConvPath, dims: &ConvDims, out_channels: usize) -> bool {
    match path {
        ConvPath::Winograd4 => {
            f2::shape_fits(dims, out_channels) && dims.output[0].min(dims.output[1]) >= 4
        }
        ConvPath::Winograd2 => f2::shape_fits(dims, out_channels),
        ConvPath::Shifted => shifted::applies(dims),
        ConvPath::Direct => direct::forward::applies(dims, out_channels),
        ConvPath::Im2col => true,
    }
}

fn forward_by(
    path: ConvPath,
    x: &[f32],
    weight: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    match path {
        ConvPath::Winograd4 => f4::forward(x, weight, dims, batch, out_channels),
        ConvPath::Winograd2 => f2::forward(x, weight, dims, batch, out_channels),
        ConvPath::Shifted => shifted::forward(x, weight, dims, batch, out_channels),
        ConvPath::Direct => direct::forward::forward(x, weight, dims, batch, out_channels),
        ConvPath::Im2col => im2col_forward(x, weight, dims, batch, out_channels),
    }
}

/// `len` values in [-1, 1) from an xorshift generator seeded by `seed`.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::ConvProbe;
    use crate::conv::geometry::ConvGeometry;
    use crate::{ConvPass, ConvPath, conv_path};

    /// Every path of every pass agrees with im2col (to rounding), and the chosen one is
    /// among them, over shapes that open each path.
    #[test]
    fn every_path_computes_the_same_pass_and_the_chosen_one_is_among_them() {
        #[rustfmt::skip]
        let shapes = [
            (16, 16, 32, 3, 1), (32, 32, 16, 3, 1), (64, 64, 8, 3, 1), (16, 32, 16, 3, 2),
            (16, 32, 16, 1, 2), (8, 8, 4, 3, 1),
        ];
        for (cin, cout, size, k, stride) in shapes {
            let geometry = ConvGeometry::new()
                .with_stride([stride, stride])
                .with_padding([(k / 2, k / 2), (k / 2, k / 2)]);
            let (input, weight) = ([2, cin, size, size], [cout, cin, k, k]);
            let probe = ConvProbe::new(input, weight, geometry).unwrap();
            for pass in [
                ConvPass::Forward,
                ConvPass::InputGradient,
                ConvPass::WeightGradient,
            ] {
                let chosen = probe.chosen(pass);
                assert_eq!(Some(chosen), conv_path(pass, input, weight, geometry));
                let paths = probe.paths(pass);
                assert!(
                    paths.contains(&chosen),
                    "{pass:?}: {chosen:?} not in {paths:?}"
                );
                let reference = probe.run(pass, ConvPath::Im2col).unwrap();
                let scale = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for path in paths {
                    let out = probe.run(pass, path).unwrap();
                    assert_eq!(out.len(), reference.len());
                    let worst = out
                        .iter()
                        .zip(&reference)
                        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        worst <= 1e-4 * scale.max(1.0),
                        "{pass:?} by {path:?}: {worst}"
                    );
                }
            }
        }
        assert!(ConvProbe::new([1, 3, 8, 8], [4, 5, 3, 3], ConvGeometry::new()).is_none());
        let strided = ConvGeometry::new().with_stride([2, 2]);
        let probe = ConvProbe::new([1, 8, 8, 8], [8, 8, 3, 3], strided).unwrap();
        assert_eq!(probe.run(ConvPass::Forward, ConvPath::Winograd2), None);
    }
}
