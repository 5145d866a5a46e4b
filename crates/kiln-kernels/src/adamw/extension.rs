//! AdamW's update registered with Burn's runtime dispatch: Flex runs
//! [`flex`](super::flex)'s one parallel pass (one call per case: the dispatch takes no
//! optional tensors). Optimizers work on tensors outside the
//! autodiff graph, so there is no autodiff counterpart.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Flex, backend_extension};

use super::flex;
use super::rule::AdamWCoefficients;

/// Backends that run kiln's AdamW kernel. Call it through [`FusedAdamW`](crate::FusedAdamW),
/// which routes other backends and dtypes to Burn's `AdamW`.
#[backend_extension(Flex)]
pub trait AdamWKernel: Backend {
    /// The first step of `param` given `grad` (the moments start from the gradient):
    /// `(param, moment_1, moment_2)`. `coefficients` must be without AMSGrad (its first
    /// maximum is the second moment).
    fn kiln_adamw_first_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        coefficients: AdamWCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// A later step, from the previous step's moments: `(param, moment_1, moment_2)`.
    /// `coefficients` must be without AMSGrad.
    fn kiln_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        coefficients: AdamWCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// A later AMSGrad step, from the previous moments and the running maximum of the
    /// second moment: `(param, moment_1, moment_2, max_moment_2)`.
    fn kiln_amsgrad_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        max_moment_2: FloatTensor<Self>,
        coefficients: AdamWCoefficients,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

impl AdamWKernel for Flex {
    fn kiln_adamw_first_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        coefficients: AdamWCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (param, m1, m2, _) = flex::step(param, grad, None, None, coefficients);
        (param, m1, m2)
    }

    fn kiln_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        coefficients: AdamWCoefficients,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let moments = Some((moment_1, moment_2));
        let (param, m1, m2, _) = flex::step(param, grad, moments, None, coefficients);
        (param, m1, m2)
    }

    fn kiln_amsgrad_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        max_moment_2: FloatTensor<Self>,
        coefficients: AdamWCoefficients,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let moments = Some((moment_1, moment_2));
        let (param, m1, m2, max) =
            flex::step(param, grad, moments, Some(max_moment_2), coefficients);
        (param, m1, m2, max.expect("AMSGrad returns its maximum"))
    }
}
