//! The kernels' parts one at a time — gemm's product, im2col's columns, Winograd
//! F(4×4, 3×3)'s transforms and its 36 products — on inputs prepared once, so that a benchmark
//! can time each part apart from the rest of a convolution (`cargo xtask bench --only
//! kernel-parts`). [`ConvProbe`](crate::ConvProbe) times whole passes by each path; these are
//! the pieces inside the paths.

use std::fmt;

use crate::conv::dims::ConvDims;
use crate::conv::geometry::ConvGeometry;
use crate::conv::im2col::columns::im2col;
use crate::conv::winograd::f4_tiles::{
    POINTS, channel_stride, input_1d, output_1d, transform_input, transform_output,
};
use crate::conv::winograd::images;
use crate::conv::winograd::tiles::Tiling;
use crate::gemm::{Matrix, matmul};

/// A block of `images` square images of `size × size` with `channels` channels, under a 3×3
/// convolution with padding 1 and unit stride to as many output channels (ResNet's shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvBlock {
    /// Input (and output) channels.
    pub channels: usize,
    /// Height and width of each image.
    pub size: usize,
    /// Images in the block.
    pub images: usize,
}

impl ConvBlock {
    fn dims(self) -> ConvDims {
        let geometry = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
        ConvDims {
            channels: self.channels,
            input: [self.size, self.size],
            kernel: [3, 3],
            output: [self.size, self.size],
            geometry,
        }
    }

    fn is_empty(self) -> bool {
        self.channels == 0 || self.size == 0 || self.images == 0
    }
}

/// One part of a kernel on inputs of one shape.
///
/// ```
/// use kiln_kernels::{ConvBlock, KernelPart};
///
/// let part = KernelPart::Gemm { m: 4, k: 8, n: 3 };
/// let prepared = part.prepare().expect("a non-empty shape");
/// assert_eq!(prepared.run().len(), 4 * 3);
/// assert_eq!(part.flops(), Some(2.0 * 4.0 * 8.0 * 3.0));
///
/// let block = ConvBlock { channels: 8, size: 8, images: 2 };
/// assert!(KernelPart::Winograd4Products(block).prepare().is_some());
/// assert!(KernelPart::Im2col(ConvBlock { images: 0, ..block }).prepare().is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPart {
    /// gemm's `[m × k] × [k × n]` product of row-major operands, on the caller's pool.
    Gemm {
        /// Rows of the product.
        m: usize,
        /// The inner dimension.
        k: usize,
        /// Columns of the product.
        n: usize,
    },
    /// im2col's column matrix for the block (`[channels·9, images·size²]`).
    Im2col(ConvBlock),
    /// Winograd F(4×4, 3×3)'s input transform, image plane by image plane.
    Winograd4Input(ConvBlock),
    /// The same transform over all the block's images at once (the layout small images take).
    Winograd4InputAcrossImages(ConvBlock),
    /// The 36 products of transformed weights and transformed input tiles.
    Winograd4Products(ConvBlock),
    /// The output transform, output plane by output plane.
    Winograd4Output(ConvBlock),
    /// The output transform over all the block's images at once.
    Winograd4OutputAcrossImages(ConvBlock),
}

impl KernelPart {
    /// The multiply-adds the part performs, counted as two operations each, where the part is a
    /// product (its other parts move and add data, and have no useful FLOP count).
    pub fn flops(&self) -> Option<f64> {
        match *self {
            KernelPart::Gemm { m, k, n } => Some(2.0 * m as f64 * k as f64 * n as f64),
            KernelPart::Winograd4Products(block) => {
                let tiles = block.images * Tiling::with_side(&block.dims(), 4).per_image();
                let c = block.channels as f64;
                Some(2.0 * POINTS as f64 * c * c * tiles as f64)
            }
            _ => None,
        }
    }

    /// The part with its inputs made (reproducible values in [-1, 1)), ready to run; `None`
    /// when a size is zero.
    pub fn prepare(self) -> Option<PreparedPart> {
        let inputs = match self {
            KernelPart::Gemm { m, k, n } => {
                if m == 0 || k == 0 || n == 0 {
                    return None;
                }
                [values(m * k, 1), values(k * n, 2)]
            }
            KernelPart::Im2col(block)
            | KernelPart::Winograd4Input(block)
            | KernelPart::Winograd4InputAcrossImages(block) => {
                if block.is_empty() {
                    return None;
                }
                [
                    values(block.images * block.dims().image_len(), 1),
                    Vec::new(),
                ]
            }
            KernelPart::Winograd4Products(block) => {
                if block.is_empty() {
                    return None;
                }
                let d = block.dims();
                let tiling = Tiling::with_side(&d, 4);
                let x = values(block.images * d.image_len(), 1);
                let tiles = block.images * tiling.per_image();
                let mut v = vec![0.0; block.channels * channel_stride(tiles)];
                transform_input(&x, &d, tiling, 0..block.images, &mut v);
                let c = block.channels;
                [values(POINTS * c * c, 3), v]
            }
            KernelPart::Winograd4Output(block) | KernelPart::Winograd4OutputAcrossImages(block) => {
                if block.is_empty() {
                    return None;
                }
                let tiles = block.images * Tiling::with_side(&block.dims(), 4).per_image();
                [values(POINTS * block.channels * tiles, 4), Vec::new()]
            }
        };
        Some(PreparedPart { part: self, inputs })
    }
}

impl fmt::Display for KernelPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, block) = match *self {
            KernelPart::Gemm { m, k, n } => return write!(f, "gemm {m}x{k}x{n}"),
            KernelPart::Im2col(block) => ("im2col", block),
            KernelPart::Winograd4Input(block) => ("winograd4 input", block),
            KernelPart::Winograd4InputAcrossImages(block) => {
                ("winograd4 input across images", block)
            }
            KernelPart::Winograd4Products(block) => ("winograd4 products", block),
            KernelPart::Winograd4Output(block) => ("winograd4 output", block),
            KernelPart::Winograd4OutputAcrossImages(block) => {
                ("winograd4 output across images", block)
            }
        };
        let ConvBlock {
            channels,
            size,
            images,
        } = block;
        write!(f, "{name} c{channels} {size}x{size} x{images}")
    }
}

/// A [`KernelPart`] with its inputs, from [`KernelPart::prepare`].
#[derive(Clone, Debug)]
pub struct PreparedPart {
    part: KernelPart,
    inputs: [Vec<f32>; 2],
}

impl PreparedPart {
    /// The part this runs.
    pub fn part(&self) -> KernelPart {
        self.part
    }

    /// Runs the part once, in the caller's rayon pool, and returns what it wrote (its output
    /// buffer, allocated on each run as the kernels allocate theirs).
    pub fn run(&self) -> Vec<f32> {
        let [a, b] = &self.inputs;
        match self.part {
            KernelPart::Gemm { m, k, n } => {
                let mut c = vec![0.0; m * n];
                let lhs = (a.as_slice(), Matrix::row_major(m, k));
                matmul(&mut c, false, lhs, (b, Matrix::row_major(k, n)));
                c
            }
            KernelPart::Im2col(block) => {
                let d = block.dims();
                let mut columns = vec![0.0; d.rows() * block.images * d.positions()];
                im2col(a, &d, 0..block.images, &mut columns);
                columns
            }
            KernelPart::Winograd4Input(block) => {
                let (d, tiling, tiles) = winograd_layout(block);
                let mut v = vec![0.0; block.channels * channel_stride(tiles)];
                transform_input(a, &d, tiling, 0..block.images, &mut v);
                v
            }
            KernelPart::Winograd4InputAcrossImages(block) => {
                let (d, tiling, tiles) = winograd_layout(block);
                let mut v = vec![0.0; block.channels * channel_stride(tiles)];
                images::transform_input::<6>(a, &d, tiling, 0..block.images, &mut v, input_1d);
                v
            }
            KernelPart::Winograd4Products(block) => products(block, a, b),
            KernelPart::Winograd4Output(block) => {
                let (d, tiling, tiles) = winograd_layout(block);
                let mut out = vec![0.0; block.images * block.channels * d.positions()];
                transform_output(a, &d, tiling, block.channels, tiles, &mut out);
                out
            }
            KernelPart::Winograd4OutputAcrossImages(block) => {
                let (d, tiling, tiles) = winograd_layout(block);
                let mut out = vec![0.0; block.images * block.channels * d.positions()];
                let c = block.channels;
                images::transform_output::<6, 4>(a, &d, tiling, c, tiles, &mut out, output_1d);
                out
            }
        }
    }
}

/// The block's sizes, its 4×4-output tiling and its tile count.
fn winograd_layout(block: ConvBlock) -> (ConvDims, Tiling, usize) {
    let d = block.dims();
    let tiling = Tiling::with_side(&d, 4);
    (d, tiling, block.images * tiling.per_image())
}

/// The 36 products `M[point] = U[point] × V[point]` of `[c × c]` weights and `[c × tiles]`
/// input tiles (read through the transform's channel stride), as the forward runs them.
fn products(block: ConvBlock, u: &[f32], v: &[f32]) -> Vec<f32> {
    let (_, _, tiles) = winograd_layout(block);
    let c = block.channels;
    let mut m = vec![0.0; POINTS * c * tiles];
    for point in 0..POINTS {
        let tiles_of_point = Matrix {
            rows: c,
            cols: tiles,
            row_stride: channel_stride(tiles),
            col_stride: 1,
        };
        matmul(
            &mut m[point * c * tiles..][..c * tiles],
            false,
            (&u[point * c * c..][..c * c], Matrix::row_major(c, c)),
            (&v[point * tiles..], tiles_of_point),
        );
    }
    m
}

/// Reproducible values in [-1, 1) (a linear congruential sequence from `seed`); the kernels'
/// tests take theirs from here too.
pub(crate) fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{ConvBlock, KernelPart, values};

    const BLOCK: ConvBlock = ConvBlock {
        channels: 5,
        size: 7,
        images: 3,
    };

    #[test]
    fn gemm_part_is_the_product_of_its_inputs() {
        let (m, k, n) = (3, 5, 4);
        let out = KernelPart::Gemm { m, k, n }.prepare().unwrap().run();
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                assert!((out[i * n + j] - want).abs() < 1e-5, "({i}, {j})");
            }
        }
    }

    #[test]
    fn im2col_part_holds_the_centre_tap_of_every_position() {
        let block = BLOCK;
        let out = KernelPart::Im2col(block).prepare().unwrap().run();
        let positions = block.size * block.size;
        let x = values(block.images * block.channels * positions, 1);
        // Row (channel, tap 4) is the centre tap: the input itself, image after image.
        let columns = block.images * positions;
        for channel in 0..block.channels {
            let row = &out[(channel * 9 + 4) * columns..][..columns];
            for image in 0..block.images {
                let plane = &x[(image * block.channels + channel) * positions..][..positions];
                assert_eq!(&row[image * positions..][..positions], plane);
            }
        }
    }

    #[test]
    fn both_layouts_of_the_input_transform_hold_the_same_tiles_and_every_winograd_part_runs() {
        let block = BLOCK;
        let plane = KernelPart::Winograd4Input(block).prepare().unwrap().run();
        let across = KernelPart::Winograd4InputAcrossImages(block)
            .prepare()
            .unwrap()
            .run();
        assert_eq!(plane.len(), across.len());
        // `[channels, 36, tiles]` rows `channel_stride` apart; plane by plane a tile is
        // `(image · rows + row) · cols + col`, across images `(row · cols + col) · images + image`.
        let side = block.size.div_ceil(4);
        let tiles = block.images * side * side;
        let stride = super::channel_stride(tiles);
        let largest = plane.iter().fold(0f32, |m, v| m.max(v.abs()));
        for channel in 0..block.channels {
            for point in 0..super::POINTS {
                let base = channel * stride + point * tiles;
                for (image, row, col) in (0..block.images)
                    .flat_map(|i| (0..side).flat_map(move |r| (0..side).map(move |c| (i, r, c))))
                {
                    let p = plane[base + (image * side + row) * side + col];
                    let a = across[base + (row * side + col) * block.images + image];
                    assert!(
                        (p - a).abs() <= 1e-6 * largest,
                        "channel {channel} point {point} tile ({image}, {row}, {col}): {p} and {a}"
                    );
                }
            }
        }
        for part in [
            KernelPart::Winograd4Products(block),
            KernelPart::Winograd4Output(block),
            KernelPart::Winograd4OutputAcrossImages(block),
        ] {
            let out = part.prepare().unwrap().run();
            assert!(out.iter().all(|v| v.is_finite()), "{part}");
            assert!(out.iter().any(|v| *v != 0.0), "{part} wrote nothing");
        }
    }

    #[test]
    fn empty_shapes_prepare_nothing_and_parts_name_their_shape() {
        assert!(KernelPart::Gemm { m: 0, k: 1, n: 1 }.prepare().is_none());
        let empty = ConvBlock { size: 0, ..BLOCK };
        assert!(KernelPart::Winograd4Products(empty).prepare().is_none());
        assert_eq!(
            KernelPart::Winograd4Output(BLOCK).to_string(),
            "winograd4 output c5 7x7 x3"
        );
        assert_eq!(KernelPart::Im2col(BLOCK).flops(), None);
        // 7×7 outputs take 2×2 tiles of 4×4 per image.
        let products = KernelPart::Winograd4Products(BLOCK).flops();
        assert_eq!(products, Some(2.0 * (36 * 5 * 5 * 3 * 4) as f64));
    }
}
