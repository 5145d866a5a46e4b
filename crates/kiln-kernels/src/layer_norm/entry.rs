//! The entry point: layer norm on kiln's kernel where it applies and Burn's otherwise.

use burn::tensor::{DType, Tensor, module};

use super::extension::LayerNormKernel;
use crate::conv::entry::on_flex;

/// Burn's [`module::layer_norm`]: `input` normalised over its last dimension (mean and
/// biased variance of each row), times `gamma`, plus `beta` when given. On Burn's CPU backend
/// (Flex, with or without autodiff) in f32 it runs kiln's kernel: one pass per row forward
/// and one backward, rows split over the replica's threads (Flex composes it from nine
/// single-threaded operations), equal to Burn's within float rounding (the tests bound it).
/// Other backends and dtypes run Burn's.
///
/// ```
/// use burn::tensor::{Device, Tensor};
///
/// let device = Device::flex();
/// let x = Tensor::<2>::from_floats([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]], &device);
/// let gamma = Tensor::<1>::ones([3], &device);
/// let y = kiln_kernels::layer_norm(x, gamma, None, 1e-5);
/// let row = y.slice([0..1, 0..3]).into_data().to_vec::<f32>().unwrap();
/// assert!((row[0] + 1.2247).abs() < 1e-3 && row[1].abs() < 1e-6);
/// ```
///
/// # Panics
///
/// If `gamma` (or `beta`) is not the size of `input`'s last dimension.
pub fn layer_norm<const D: usize>(
    input: Tensor<D>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    epsilon: f64,
) -> Tensor<D> {
    let width = input.dims()[D - 1];
    assert!(
        gamma.dims() == [width] && beta.as_ref().is_none_or(|b| b.dims() == [width]),
        "layer_norm: the scale {:?} and shift {:?} must match the last dimension {width}",
        gamma.dims(),
        beta.as_ref().map(|b| b.dims())
    );
    let f32_flex = |on_flex: bool, dtype: DType| on_flex && dtype == DType::F32;
    let kernel = f32_flex(on_flex(&input), input.dtype())
        && f32_flex(on_flex(&gamma), gamma.dtype())
        && beta
            .as_ref()
            .is_none_or(|b| f32_flex(on_flex(b), b.dtype()))
        && input.device() == gamma.device()
        && input.shape().num_elements() > 0;
    if !kernel {
        return module::layer_norm(input, gamma, beta, epsilon);
    }
    let beta = beta.unwrap_or_else(|| Tensor::zeros([width], &gamma.device()));
    Tensor::from_dispatch(
        <burn::backend::Dispatch as LayerNormKernel>::kiln_layer_norm(
            input.into_dispatch(),
            gamma.into_dispatch(),
            beta.into_dispatch(),
            epsilon,
        ),
    )
}
