//! The convolution on Flex tensors: im2col and one GEMM per block of images, written
//! straight into the NCHW output; the backward pass is two more GEMMs and a col2im. Each
//! pass runs the algorithm `conv_path` chooses (Winograd, direct, shifted GEMMs or im2col);
//! the flipped-kernel input gradient follows the forward's choice for its transposed shape.
//!
//! Blocks hold enough images for a GEMM of at least [`BLOCK_POSITIONS`] output positions
//! (one image of a large feature map, several of a small one) and run in parallel in the
//! caller's rayon pool, each with a column buffer of its rayon split (reused block after
//! block), so memory stays at a few blocks' columns. Blocks follow the shapes only, never
//! the thread count, and so does every summation order (the weight gradient adds its
//! blocks' partial sums in a fixed order, `block_sum`): results do not depend on threads.

use std::ops::Range;

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, FlexDevice, TensorMetadata};
use burn::tensor::{DType, FloatDType, Shape, TensorData};
use rayon::prelude::*;

use crate::conv::block_sum::{block, sum_over_blocks};
use crate::conv::dims::ConvDims;
use crate::conv::geometry::ConvGeometry;
use crate::conv::im2col::columns::{col2im, im2col};
use crate::conv::path::{ConvPath, forward_path, weight_gradient_path};
use crate::conv::winograd::{f2, f4};
use crate::conv::{direct, shifted};
use crate::gemm::{Matrix, matmul};
use crate::zeroed::zeroed;

/// Output positions (images × Ho·Wo) a block's GEMM should see at least.
const BLOCK_POSITIONS: usize = 256;

type FlexTensor = FloatTensor<Flex>;

/// Sizes of a convolution of `x` `[N, Cin, H, W]` with `weight` `[Cout, Cin, kh, kw]`:
/// `(dims, N, Cout)`.
///
/// # Panics
///
/// If the shapes are not 4-D, the channels differ, or the padded input is smaller than the
/// dilated kernel (programmer errors: `kiln_kernels::conv2d_with` checks them first).
fn sizes(x: &Shape, weight: &Shape, geometry: ConvGeometry) -> (ConvDims, usize, usize) {
    let [batch, channels, height, width] = x.dims();
    let [out_channels, in_channels, kh, kw] = weight.dims();
    assert_eq!(channels, in_channels, "input and weight channels differ");
    let output = geometry
        .output_size([height, width], [kh, kw])
        .expect("the padded input is smaller than the kernel");
    let dims = ConvDims {
        channels,
        input: [height, width],
        kernel: [kh, kw],
        output,
        geometry,
    };
    (dims, batch, out_channels)
}

/// Images per block.
fn block_size(dims: &ConvDims) -> usize {
    BLOCK_POSITIONS.div_ceil(dims.positions().max(1)).max(1)
}

fn to_f32(tensor: FlexTensor) -> FlexTensor {
    if tensor.dtype() == DType::F32 {
        tensor
    } else {
        Flex::float_cast(tensor, FloatDType::F32)
    }
}

fn cast_back(tensor: FlexTensor, dtype: DType) -> FlexTensor {
    if dtype == DType::F32 {
        tensor
    } else {
        Flex::float_cast(tensor, dtype.into())
    }
}

fn from_vec(values: Vec<f32>, shape: impl Into<Shape>) -> FlexTensor {
    Flex::float_from_data(TensorData::new(values, shape.into()), &FlexDevice)
}

fn values(tensor: &FlexTensor) -> &[f32] {
    tensor
        .as_slice::<f32>()
        .expect("a contiguous f32 tensor (made so by the caller)")
}

/// The output gradient of `images` as a `[Cout, nc·Ho·Wo]` matrix (channels first, images
/// side by side) in `buffer`, its rows one cache line further apart than their length: gemm
/// repacks this operand, reading it across rows, and at a power-of-two distance (1 024
/// positions of a 32×32 image) every row's element falls into the same cache sets.
fn gathered<'a>(
    grad: &[f32],
    dims: &ConvDims,
    out_channels: usize,
    images: Range<usize>,
    buffer: &'a mut Vec<f32>,
) -> (&'a [f32], Matrix) {
    let positions = dims.positions();
    let count = images.len();
    let width = count * positions;
    let stride = width + 16;
    buffer.resize(stride * out_channels, 0.0);
    for (channel, row) in buffer.chunks_mut(stride).enumerate() {
        for (slot, image) in images.clone().enumerate() {
            row[slot * positions..][..positions].copy_from_slice(
                &grad[(image * out_channels + channel) * positions..][..positions],
            );
        }
    }
    let matrix = Matrix {
        rows: out_channels,
        cols: width,
        row_stride: stride,
        col_stride: 1,
    };
    (buffer, matrix)
}

/// `x` `[N, Cin, H, W]` convolved with `weight` `[Cout, Cin, kh, kw]`: `[N, Cout, Ho, Wo]` in
/// `x`'s dtype (computed in f32).
pub(crate) fn forward(x: FlexTensor, weight: FlexTensor, geometry: ConvGeometry) -> FlexTensor {
    let dtype = x.dtype();
    let (dims, batch, out_channels) = sizes(&x.shape(), &weight.shape(), geometry);
    let (x, weight) = (to_f32(x).to_contiguous(), to_f32(weight).to_contiguous());
    let output = forward_values(values(&x), values(&weight), &dims, batch, out_channels);
    let [out_h, out_w] = dims.output;
    cast_back(from_vec(output, [batch, out_channels, out_h, out_w]), dtype)
}

/// The forward on plain slices: `x` `[N, Cin, H, W]`, `weight` `[Cout, Cin·kh·kw]`; by
/// Winograd's algorithm or the shifted GEMMs where they apply, else im2col.
pub(crate) fn forward_values(
    x: &[f32],
    weight: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    match forward_path(dims, out_channels) {
        ConvPath::Winograd4 => f4::forward(x, weight, dims, batch, out_channels),
        ConvPath::Direct => direct::forward::forward(x, weight, dims, batch, out_channels),
        ConvPath::Shifted => shifted::forward(x, weight, dims, batch, out_channels),
        ConvPath::Winograd2 => f2::forward(x, weight, dims, batch, out_channels),
        ConvPath::Im2col => im2col_forward(x, weight, dims, batch, out_channels),
    }
}

/// The forward by im2col and one GEMM per block of images.
pub(crate) fn im2col_forward(
    x: &[f32],
    weight: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let weight = (weight, Matrix::row_major(out_channels, dims.rows()));
    let positions = dims.positions();
    let size = block_size(dims);
    let mut output = zeroed(batch * out_channels * positions);
    output
        .par_chunks_mut(size * out_channels * positions)
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new()),
            |(columns, product), (index, out)| {
                let images = block(index, size, batch);
                let width = images.len() * positions;
                columns.resize(dims.rows() * width, 0.0);
                im2col(x, dims, images.clone(), columns);
                let columns = (&columns[..], Matrix::row_major(dims.rows(), width));
                if images.len() == 1 {
                    matmul(out, false, weight, columns);
                    return;
                }
                // [Cout, slot, P] -> [slot, Cout, P]
                product.resize(out_channels * width, 0.0);
                matmul(product, false, weight, columns);
                let count = images.len();
                for (index, dst) in out.chunks_mut(positions).enumerate() {
                    let (slot, channel) = (index / out_channels, index % out_channels);
                    dst.copy_from_slice(
                        &product[(channel * count + slot) * positions..][..positions],
                    );
                }
            },
        );
    output
}

/// The gradients of `forward(x, weight)` given the output gradient `grad`: the input's
/// (`want_input`) and the weight's (`want_weight`), each in its tensor's dtype.
pub(crate) fn backward(
    x: FlexTensor,
    weight: FlexTensor,
    grad: FlexTensor,
    geometry: ConvGeometry,
    want_input: bool,
    want_weight: bool,
) -> (Option<FlexTensor>, Option<FlexTensor>) {
    let (x_dtype, weight_dtype) = (x.dtype(), weight.dtype());
    let (x_shape, weight_shape) = (x.shape(), weight.shape());
    let (dims, batch, out_channels) = sizes(&x_shape, &weight_shape, geometry);
    let x = to_f32(x).to_contiguous();
    let weight = to_f32(weight).to_contiguous();
    let grad = to_f32(grad).to_contiguous();
    let (x, weight, grad) = (values(&x), values(&weight), values(&grad));
    let input_grad = want_input.then(|| {
        let values = input_gradient(weight, grad, &dims, batch, out_channels);
        cast_back(from_vec(values, x_shape), x_dtype)
    });
    let weight_grad = want_weight.then(|| {
        let values = weight_gradient(x, grad, &dims, batch, out_channels);
        cast_back(from_vec(values, weight_shape), weight_dtype)
    });
    (input_grad, weight_grad)
}

/// The input gradient: for unit strides a forward convolution of the output gradient with the
/// kernel flipped and its channels swapped (an im2col and a GEMM whose inner dimension is
/// `Cout·kh·kw`); otherwise `col2im(weightᵀ × grad)`, whose GEMM has only `Cout` there.
pub(crate) fn input_gradient(
    weight: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    if let Some(transposed) = transposed_dims(dims, out_channels) {
        let flipped = flipped_weight(weight, dims, out_channels);
        return forward_values(grad, &flipped, &transposed, batch, dims.channels);
    }
    scattered_input_gradient(weight, grad, dims, batch, out_channels)
}

/// The convolution whose output is the input gradient of a unit-stride convolution `dims`
/// (over the output gradient, `out_channels` channels): the same kernel and dilation, padding
/// `dilation·(k − 1) − padding` on each side. `None` for other strides, or when a padding
/// exceeds the dilated kernel's reach (the gradient then has no such form).
pub(crate) fn transposed_dims(dims: &ConvDims, out_channels: usize) -> Option<ConvDims> {
    let g = dims.geometry;
    if g.stride != [1, 1] {
        return None;
    }
    let reach = |d: usize| g.dilation[d] * (dims.kernel[d] - 1);
    let pad = |d: usize, side: usize| reach(d).checked_sub(side);
    let padding = [
        (pad(0, g.padding[0].0)?, pad(0, g.padding[0].1)?),
        (pad(1, g.padding[1].0)?, pad(1, g.padding[1].1)?),
    ];
    let geometry = ConvGeometry::new()
        .with_padding(padding)
        .with_dilation(g.dilation);
    let output = geometry.output_size(dims.output, dims.kernel)?;
    (output == dims.input).then_some(ConvDims {
        channels: out_channels,
        input: dims.output,
        kernel: dims.kernel,
        output,
        geometry,
    })
}

/// `weight` `[Cout, Cin, kh, kw]` as `[Cin, Cout, kh, kw]`, each kernel rotated by 180°.
pub(crate) fn flipped_weight(weight: &[f32], dims: &ConvDims, out_channels: usize) -> Vec<f32> {
    let [kh, kw] = dims.kernel;
    let taps = kh * kw;
    let mut flipped = zeroed(weight.len());
    flipped
        .par_chunks_mut(out_channels * taps)
        .enumerate()
        .for_each(|(c, kernels)| {
            for (o, dst) in kernels.chunks_exact_mut(taps).enumerate() {
                let src = &weight[(o * dims.channels + c) * taps..][..taps];
                for (d, s) in dst.iter_mut().zip(src.iter().rev()) {
                    *d = *s;
                }
            }
        });
    flipped
}

/// `col2im(weightᵀ × grad)`, block by block.
pub(crate) fn scattered_input_gradient(
    weight: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let weight_t = (
        weight,
        Matrix::row_major(out_channels, dims.rows()).transposed(),
    );
    let size = block_size(dims);
    let mut input_grad = zeroed(batch * dims.image_len());
    input_grad
        .par_chunks_mut(size * dims.image_len())
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new()),
            |(gathered_grad, column_grad), (index, dx)| {
                let images = block(index, size, batch);
                let width = images.len() * dims.positions();
                let upstream = gathered(grad, dims, out_channels, images.clone(), gathered_grad);
                column_grad.resize(dims.rows() * width, 0.0);
                matmul(column_grad, false, weight_t, upstream);
                col2im(column_grad, dims, images, dx);
            },
        );
    input_grad
}

/// The weight gradient `[Cout, Cin·kh·kw]`: by Winograd's algorithm or the shifted GEMMs where
/// they apply, else [`im2col_weight_gradient`].
pub(crate) fn weight_gradient(
    x: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    match weight_gradient_path(dims, out_channels) {
        ConvPath::Direct => {
            direct::weight_gradient::weight_gradient(x, grad, dims, batch, out_channels)
        }
        ConvPath::Winograd2 => f2::weight_gradient(x, grad, dims, batch, out_channels),
        ConvPath::Shifted => shifted::weight_gradient(x, grad, dims, batch, out_channels),
        ConvPath::Winograd4 | ConvPath::Im2col => {
            im2col_weight_gradient(x, grad, dims, batch, out_channels)
        }
    }
}

/// `Σ grad × columnsᵀ` over the batch: groups of blocks in parallel, their sums added in order.
///
/// Each block computes the transposed product, `columns × gradᵀ` (`[K, Cout]`), and the total
/// is transposed once at the end: both operands are contiguous along the positions summed
/// over, so gemm must repack one of them per block, and this orientation makes that the
/// output gradient (`Cout × positions`) instead of the columns (`Cin·kh·kw × positions`,
/// e.g. 9× more for a 3×3 kernel with Cin = Cout; measured: gemm's packing was a quarter of
/// a ResNet-18 step).
pub(crate) fn im2col_weight_gradient(
    x: &[f32],
    grad: &[f32],
    dims: &ConvDims,
    batch: usize,
    out_channels: usize,
) -> Vec<f32> {
    let size = block_size(dims);
    let len = out_channels * dims.rows();
    let total = sum_over_blocks(
        batch.div_ceil(size),
        len,
        || (Vec::new(), Vec::new()),
        |partial, accumulate, index, (columns, gathered_grad)| {
            let images = block(index, size, batch);
            let width = images.len() * dims.positions();
            columns.resize(dims.rows() * width, 0.0);
            im2col(x, dims, images.clone(), columns);
            let (upstream, matrix) = gathered(grad, dims, out_channels, images, gathered_grad);
            matmul(
                partial,
                accumulate,
                (columns, Matrix::row_major(dims.rows(), width)),
                (upstream, matrix.transposed()),
            );
        },
    );
    // [K, Cout] -> [Cout, K]
    transposed(&total, dims.rows(), out_channels)
}

/// Output rows per parallel piece of [`transposed`]: each piece reads this many consecutive
/// elements of every input row.
const TRANSPOSE_ROWS: usize = 16;

/// The row-major `[rows, cols]` matrix `m` as `[cols, rows]`: pieces of output rows in
/// parallel, each filling its rows column by column (serial and element by element, this
/// was a visible part of a width-64 step's main thread on 2 threads).
pub(crate) fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = zeroed(rows * cols);
    out.par_chunks_mut((TRANSPOSE_ROWS * rows).max(1))
        .enumerate()
        .for_each(|(piece, dst)| {
            let first = piece * TRANSPOSE_ROWS;
            for (r, src) in m.chunks_exact(cols).enumerate() {
                let values = &src[first..][..dst.len() / rows];
                for (k, value) in values.iter().enumerate() {
                    dst[k * rows + r] = *value;
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::{block_size, sizes, transposed};
    use crate::conv::block_sum::block;
    use crate::conv::geometry::ConvGeometry;
    use burn::tensor::Shape;

    #[test]
    fn blocks_hold_enough_positions_and_cover_the_batch() {
        let (large, _, _) = sizes(
            &Shape::new([32, 16, 32, 32]),
            &Shape::new([16, 16, 3, 3]),
            ConvGeometry::new().with_padding([(1, 1), (1, 1)]),
        );
        assert_eq!(block_size(&large), 1);
        let (small, _, _) = sizes(
            &Shape::new([5, 8, 4, 4]),
            &Shape::new([2, 8, 1, 1]),
            ConvGeometry::new(),
        );
        assert_eq!(block_size(&small), 16);
        assert_eq!(block(0, 16, 5), 0..5);
        assert_eq!(block(2, 3, 7), 6..7);
    }

    #[test]
    fn transposed_matches_the_definition_in_pieces() {
        for (rows, cols) in [(37, 53), (1, 40), (40, 1), (16, 16), (0, 5)] {
            let m: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = transposed(&m, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(t[c * rows + r], m[r * cols + c], "{rows}x{cols} at {r},{c}");
                }
            }
        }
    }
}
