//! The entry point: one SGD step of a parameter on kiln's kernel where it applies (f32 on
//! Burn's CPU backend), Burn's tensor operations otherwise.

use burn::tensor::{DType, Tensor};

use super::extension::SgdKernel;
use super::rule::SgdCoefficients;
use crate::conv::entry::on_flex;

type Dispatch = burn::backend::Dispatch;

/// One SGD step of `param` given its gradient `grad` and the velocity the previous step
/// returned (`None` on the first step): `(new param, new velocity)`, the velocity `Some`
/// exactly when `coefficients` has momentum. Burn's `Sgd` arithmetic bit for bit (weight
/// decay `param · penalty + grad`, then `v = (1 − dampening) · g + momentum · v`, then
/// `param − lr · v`, or `momentum · v + g` under Nesterov), but for an f32 parameter on the
/// CPU in one pass over the parameter, gradient and velocity, split over the caller's rayon
/// pool and in place where their buffers are not shared; other backends and dtypes run
/// Burn's operations. Tensors must be outside the autodiff graph, as an optimizer's are.
///
/// ```
/// use burn::tensor::{Device, Tensor};
/// use kiln_kernels::{SgdCoefficients, sgd_step};
///
/// let device = Device::flex();
/// let param = Tensor::<1>::from_floats([1.0, 2.0], &device);
/// let grad = Tensor::<1>::from_floats([0.5, -1.0], &device);
/// let c = SgdCoefficients { lr: 0.5, weight_decay: None, momentum: None };
/// let (param, velocity) = sgd_step(param, grad, None, c);
/// assert_eq!(param.to_data().to_vec::<f32>().unwrap(), vec![0.75, 2.5]);
/// assert!(velocity.is_none());
/// ```
///
/// # Panics
///
/// If `grad` (or the velocity) does not have `param`'s shape, or a velocity is given without
/// momentum.
pub fn sgd_step<const D: usize>(
    param: Tensor<D>,
    grad: Tensor<D>,
    velocity: Option<Tensor<D>>,
    coefficients: SgdCoefficients,
) -> (Tensor<D>, Option<Tensor<D>>) {
    assert_eq!(param.shape(), grad.shape(), "sgd: gradient shape");
    assert!(
        velocity.is_none() || coefficients.momentum.is_some(),
        "sgd: a velocity without momentum"
    );
    if let Some(v) = &velocity {
        assert_eq!(v.shape(), param.shape(), "sgd: velocity shape");
    }
    let f32_flex = |t: &Tensor<D>| on_flex(t) && t.dtype() == DType::F32;
    let fits = f32_flex(&param)
        && f32_flex(&grad)
        && grad.device() == param.device()
        && velocity
            .as_ref()
            .is_none_or(|v| f32_flex(v) && v.device() == param.device());
    if !fits {
        return burn_sgd_step(param, grad, velocity, coefficients);
    }
    let (param, grad) = (param.into_dispatch(), grad.into_dispatch());
    match (coefficients.momentum, velocity) {
        (None, _) => {
            let param = <Dispatch as SgdKernel>::kiln_sgd_step(param, grad, coefficients);
            (Tensor::from_dispatch(param), None)
        }
        (Some(_), Some(velocity)) => {
            let (param, velocity) = <Dispatch as SgdKernel>::kiln_sgd_momentum_step(
                param,
                grad,
                velocity.into_dispatch(),
                coefficients,
            );
            (
                Tensor::from_dispatch(param),
                Some(Tensor::from_dispatch(velocity)),
            )
        }
        (Some(_), None) => {
            let (param, velocity) =
                <Dispatch as SgdKernel>::kiln_sgd_first_momentum_step(param, grad, coefficients);
            (
                Tensor::from_dispatch(param),
                Some(Tensor::from_dispatch(velocity)),
            )
        }
    }
}

/// The same step in Burn's tensor operations, as Burn's `Sgd` composes them.
pub(crate) fn burn_sgd_step<const D: usize>(
    param: Tensor<D>,
    grad: Tensor<D>,
    velocity: Option<Tensor<D>>,
    c: SgdCoefficients,
) -> (Tensor<D>, Option<Tensor<D>>) {
    let grad = match c.weight_decay {
        Some(penalty) => param.clone().mul_scalar(penalty).add(grad),
        None => grad,
    };
    let (step, velocity) = match c.momentum {
        None => (grad, None),
        Some(m) => {
            let velocity = match velocity {
                Some(v) => grad
                    .clone()
                    .mul_scalar(m.gradient_scale)
                    .add(v.mul_scalar(m.momentum)),
                None => grad.clone(),
            };
            let step = if m.nesterov {
                velocity.clone().mul_scalar(m.momentum).add(grad)
            } else {
                velocity.clone()
            };
            (step, Some(velocity))
        }
    };
    (param - step.mul_scalar(c.lr), velocity)
}
