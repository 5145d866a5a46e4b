//! SGD's update registered with Burn's runtime dispatch: Flex runs
//! [`flex`](super::flex)'s one parallel pass. Optimizers work on tensors outside the
//! autodiff graph, so there is no autodiff counterpart.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Flex, backend_extension};

use super::flex;
use super::rule::SgdCoefficients;

/// Backends that run kiln's SGD kernel. Call it through [`sgd_step`](crate::sgd_step), which
/// routes other backends and dtypes to Burn's operations.
#[backend_extension(Flex)]
pub trait SgdKernel: Backend {
    /// One step of `param` given `grad`, without momentum: the new parameter.
    fn kiln_sgd_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        coefficients: SgdCoefficients,
    ) -> FloatTensor<Self>;

    /// One step with momentum from the previous step's `velocity`: `(param, velocity)`.
    fn kiln_sgd_momentum_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        velocity: FloatTensor<Self>,
        coefficients: SgdCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Momentum's first step (the velocity starts as the gradient): `(param, velocity)`.
    fn kiln_sgd_first_momentum_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        coefficients: SgdCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

impl SgdKernel for Flex {
    fn kiln_sgd_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        coefficients: SgdCoefficients,
    ) -> FloatTensor<Self> {
        flex::step(param, grad, None, coefficients).0
    }

    fn kiln_sgd_momentum_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        velocity: FloatTensor<Self>,
        coefficients: SgdCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (param, velocity) = flex::step(param, grad, Some(velocity), coefficients);
        (param, velocity.expect("momentum returns a velocity"))
    }

    fn kiln_sgd_first_momentum_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        coefficients: SgdCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (param, velocity) = flex::step(param, grad, None, coefficients);
        (param, velocity.expect("momentum returns a velocity"))
    }
}
