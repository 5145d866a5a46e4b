//! The entry points: batch norm in training and in inference mode on kiln's kernel where it
//! applies, Burn's otherwise.

use burn::tensor::Tensor;
use burn::tensor::module::{
    batch_norm as burn_batch_norm, batch_norm_train as burn_batch_norm_train,
};

use crate::batch_norm::extension::BatchNormKernel;
use crate::conv::entry::{kernel_dtype, on_flex};

/// A batch normalised with its own statistics: the output and the per-channel mean and biased
/// variance (what running statistics are updated from; they carry no gradient).
#[derive(Debug, Clone)]
pub struct NormalizedBatch {
    /// `(x − mean) / √(variance + ε) · γ + β`.
    pub output: Tensor<4>,
    /// Per-channel mean of the batch.
    pub mean: Tensor<1>,
    /// Per-channel biased variance of the batch.
    pub variance: Tensor<1>,
}

/// Burn's `batch_norm_train` for `[N, C, H, W]` inputs, computed by kiln's kernel on Burn's
/// CPU backend (Flex) and by Burn otherwise. Equal to Burn's within float rounding, output
/// and gradients. f16/bf16 inputs are computed in f32 (sums in f64) and cast back; the
/// statistics come back in `gamma`'s dtype (the backward keeps them in f32). f64 inputs,
/// other backends and empty batches run Burn's.
///
/// ```
/// use burn::tensor::{Device, Distribution, Tensor};
///
/// let device = Device::flex().autodiff();
/// let x = Tensor::<4>::random([4, 3, 5, 5], Distribution::Default, &device).require_grad();
/// let gamma = Tensor::<1>::ones([3], &device).require_grad();
/// let beta = Tensor::<1>::zeros([3], &device).require_grad();
/// let batch = kiln_kernels::batch_norm_train(x.clone(), gamma, beta, 1e-5);
/// assert_eq!(batch.mean.dims(), [3]);
/// let grads = (batch.output * x.clone()).sum().backward();
/// assert!(x.grad(&grads).is_some());
/// ```
///
/// # Panics
///
/// If `gamma` or `beta` does not have one entry per channel.
pub fn batch_norm_train(
    x: Tensor<4>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    epsilon: f64,
) -> NormalizedBatch {
    let channels = x.dims()[1];
    assert_eq!(
        gamma.dims(),
        [channels],
        "batch norm: one gamma per channel"
    );
    assert_eq!(beta.dims(), [channels], "batch norm: one beta per channel");
    let dtypes = [x.dtype(), gamma.dtype(), beta.dtype()]
        .into_iter()
        .all(kernel_dtype);
    if !(on_flex(&x) && dtypes) || x.shape().num_elements() == 0 {
        let result = burn_batch_norm_train(x, gamma, beta, epsilon);
        return NormalizedBatch {
            output: result.output,
            mean: result.mean,
            variance: result.variance,
        };
    }
    let (output, mean, variance) =
        <burn::backend::Dispatch as BatchNormKernel>::kiln_batch_norm_train(
            x.into_dispatch(),
            gamma.into_dispatch(),
            beta.into_dispatch(),
            epsilon,
        );
    NormalizedBatch {
        output: Tensor::from_dispatch(output),
        mean: Tensor::from_dispatch(mean),
        variance: Tensor::from_dispatch(variance),
    }
}

/// Burn's inference-mode `batch_norm` for `[N, C, H, W]` inputs: `(x − mean) / √(variance +
/// ε) · γ + β` with given per-channel statistics (a layer's running mean and variance). On
/// Burn's CPU backend without autodiff (evaluation, inference) it is one pass over `x` split
/// over the pool, where Burn's composition makes four single-threaded broadcast passes; equal
/// to Burn's within float rounding (the per-channel factors are computed in f64). Under
/// autodiff (a frozen layer being fine-tuned) and on other backends it is Burn's own.
/// f16/bf16 inputs are computed in f32 and cast back.
///
/// ```
/// use burn::tensor::{Device, Distribution, Tensor};
///
/// let device = Device::flex();
/// let x = Tensor::<4>::random([4, 3, 5, 5], Distribution::Default, &device);
/// let (gamma, beta) = (Tensor::<1>::ones([3], &device), Tensor::<1>::zeros([3], &device));
/// let (mean, variance) = (Tensor::<1>::zeros([3], &device), Tensor::<1>::ones([3], &device));
/// let y = kiln_kernels::batch_norm_inference(x, (gamma, beta), (mean, variance), 1e-5);
/// assert_eq!(y.dims(), [4, 3, 5, 5]);
/// ```
///
/// # Panics
///
/// If `gamma`, `beta`, `mean` or `variance` does not have one entry per channel.
pub fn batch_norm_inference(
    x: Tensor<4>,
    (gamma, beta): (Tensor<1>, Tensor<1>),
    (mean, variance): (Tensor<1>, Tensor<1>),
    epsilon: f64,
) -> Tensor<4> {
    let channels = x.dims()[1];
    for (name, t) in [
        ("gamma", &gamma),
        ("beta", &beta),
        ("mean", &mean),
        ("variance", &variance),
    ] {
        assert_eq!(t.dims(), [channels], "batch norm: one {name} per channel");
    }
    let dtypes = [&gamma, &beta, &mean, &variance]
        .into_iter()
        .map(|t| t.dtype())
        .chain([x.dtype()])
        .all(kernel_dtype);
    if !(on_flex(&x) && dtypes) || x.shape().num_elements() == 0 {
        return burn_batch_norm(x, gamma, beta, mean, variance, epsilon);
    }
    let output = <burn::backend::Dispatch as BatchNormKernel>::kiln_batch_norm_inference(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        mean.into_dispatch(),
        variance.into_dispatch(),
        epsilon,
    );
    Tensor::from_dispatch(output)
}
