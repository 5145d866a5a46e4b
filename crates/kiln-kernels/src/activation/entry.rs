//! The entry points: ReLU, a residual addition followed by ReLU, and GELU, on kiln's kernels where
//! they apply and Burn's operations otherwise.

use burn::tensor::activation;
use burn::tensor::{DType, Tensor};

use crate::activation::extension::ActivationKernel;
use crate::conv::entry::on_flex;

/// Whether kiln's activation kernels run on `x`: f32 on Burn's CPU backend (Flex, with or
/// without autodiff). Flex runs its own element-wise operations on one thread; kiln's split
/// the pass over the replica's threads.
fn kernel_applies<const D: usize>(x: &Tensor<D>) -> bool {
    on_flex(x) && x.dtype() == DType::F32
}

/// `activation::relu(x)` in parallel on the CPU; equal to Burn's bit for bit, output and
/// gradient (NaN propagates, the gradient is kept where the output is above zero or NaN).
/// Other backends and dtypes run Burn's ReLU.
///
/// ```
/// use burn::tensor::{Device, Tensor};
///
/// let device = Device::flex().autodiff();
/// let x = Tensor::<1>::from_floats([-1.0, 0.5, 2.0], &device).require_grad();
/// let y = kiln_kernels::relu(x.clone());
/// assert_eq!(y.to_data().try_to_vec::<f32>().unwrap(), vec![0.0, 0.5, 2.0]);
/// let grads = y.sum().backward();
/// let grad = x.grad(&grads).unwrap().to_data().try_to_vec::<f32>().unwrap();
/// assert_eq!(grad, vec![0.0, 1.0, 1.0]);
/// ```
pub fn relu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !kernel_applies(&x) || x.shape().num_elements() == 0 {
        return activation::relu(x);
    }
    Tensor::from_dispatch(<burn::backend::Dispatch as ActivationKernel>::kiln_relu(
        x.into_dispatch(),
    ))
}

/// `activation::relu(a + b)` in one parallel pass on the CPU (a residual block's end), equal
/// to Burn's bit for bit; both inputs receive the masked gradient. Tensors of different
/// shapes (broadcasting), dtypes or devices, and other backends, run Burn's two operations.
///
/// ```
/// use burn::tensor::{Device, Tensor};
///
/// let device = Device::flex();
/// let a = Tensor::<1>::from_floats([-1.0, 0.5, 2.0], &device);
/// let b = Tensor::<1>::from_floats([0.5, -1.0, 1.0], &device);
/// let y = kiln_kernels::add_relu(a, b);
/// assert_eq!(y.to_data().try_to_vec::<f32>().unwrap(), vec![0.0, 0.0, 3.0]);
/// ```
pub fn add_relu<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    let fits = a.shape() == b.shape()
        && a.device() == b.device()
        && kernel_applies(&a)
        && kernel_applies(&b)
        && a.shape().num_elements() > 0;
    if !fits {
        return activation::relu(a + b);
    }
    Tensor::from_dispatch(
        <burn::backend::Dispatch as ActivationKernel>::kiln_add_relu(
            a.into_dispatch(),
            b.into_dispatch(),
        ),
    )
}

/// `activation::gelu(x)` (the exact, erf form) in parallel and vectorised on the CPU, within
/// 4e-7·(1 + |x|) of Burn's output and gradient: its `erf` is a branch-free approximation
/// within 2.5e-7 of libm's (the one PyTorch's vectorised CPU kernels use), where Flex calls
/// libm's `erff` one element at a time on one thread. A transformer's MLP applies GELU to its
/// widest activation. Other backends and dtypes run Burn's GELU.
///
/// ```
/// use burn::tensor::{Device, Tensor};
///
/// let device = Device::flex().autodiff();
/// let x = Tensor::<1>::from_floats([-1.0, 0.0, 2.0], &device).require_grad();
/// let y = kiln_kernels::gelu(x.clone());
/// let expected = burn::tensor::activation::gelu(x.clone().detach());
/// let difference: f32 = (y.clone() - expected).abs().max().into_scalar();
/// assert!(difference < 1e-6);
/// let grads = y.sum().backward();
/// assert!(x.grad(&grads).is_some());
/// ```
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !kernel_applies(&x) || x.shape().num_elements() == 0 {
        return activation::gelu(x);
    }
    Tensor::from_dispatch(<burn::backend::Dispatch as ActivationKernel>::kiln_gelu(
        x.into_dispatch(),
    ))
}
