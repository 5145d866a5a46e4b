//! SGD's update (weight decay, momentum, Nesterov) on f32 Flex tensors: one pass over the
//! parameter, its gradient and its velocity, split into pieces over the caller's rayon pool,
//! in place where the parameter and velocity buffers are not shared.
//!
//! Burn's `Sgd` composes the same update from up to seven element-wise operations, each a
//! separate pass (and buffer) on one thread: at ResNet-18 width 64 that was about 7 % of a
//! two-thread step's busiest thread, with the second core idle. Each element here gets Burn's
//! formula, operation for operation (Rust never fuses `a * b + c`), so the results are
//! Burn's bit for bit, at any thread count and vector width.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, FlexDevice, TensorMetadata};
use burn::tensor::TensorData;
use rayon::prelude::*;

use super::rule::SgdCoefficients;
use crate::activation::flex::{each_in_place, readable};
use crate::simd::simd;
use crate::update_buffer::UpdateBuffer;
use crate::zeroed::zeroed;

type FlexTensor = FloatTensor<Flex>;

/// Elements per parallel piece.
const PIECE: usize = 1 << 14;

/// One SGD step of `param` given `grad` (same shape; any float dtype is read as f32, the
/// parameter is f32) and the velocity of the previous step: `(new param, new velocity)`, the
/// velocity `Some` exactly when `coefficients` has momentum.
///
/// # Panics
///
/// If the shapes differ, or a velocity is given without momentum.
pub(crate) fn step(
    param: FlexTensor,
    grad: FlexTensor,
    velocity: Option<FlexTensor>,
    coefficients: SgdCoefficients,
) -> (FlexTensor, Option<FlexTensor>) {
    assert_eq!(param.shape(), grad.shape(), "sgd: gradient shape");
    assert!(
        velocity.is_none() || coefficients.momentum.is_some(),
        "sgd: a velocity without momentum"
    );
    let grad = readable(grad);
    let g = grad.as_slice::<f32>().expect("contiguous f32");
    let mut param = UpdateBuffer::new(param);
    let c = coefficients;
    let velocity = match (c.momentum, velocity) {
        (None, _) => {
            each_in_place(param.values(), Some(g), |p, g| c.element(p, g, None).0);
            None
        }
        (Some(_), Some(velocity)) => {
            assert_eq!(velocity.shape(), grad.shape(), "sgd: velocity shape");
            let mut velocity = UpdateBuffer::new(velocity);
            with_velocity(param.values(), velocity.values(), g, c, false);
            Some(velocity.finish())
        }
        (Some(_), None) => {
            // The first step: the velocity starts as the (decayed) gradient.
            let mut velocity = zeroed(g.len());
            with_velocity(param.values(), &mut velocity, g, c, true);
            Some(Flex::float_from_data(
                TensorData::new(velocity, grad.shape()),
                &FlexDevice,
            ))
        }
    };
    (param.finish(), velocity)
}

/// The step of `param` and `velocity` given `grad`, in pieces over the pool; on momentum's
/// `first` step the velocity's old values are not read (it starts as the gradient).
fn with_velocity(
    param: &mut [f32],
    velocity: &mut [f32],
    grad: &[f32],
    c: SgdCoefficients,
    first: bool,
) {
    param
        .par_chunks_mut(PIECE)
        .zip(velocity.par_chunks_mut(PIECE))
        .zip(grad.par_chunks(PIECE))
        .for_each(|((p, v), g)| {
            simd(
                #[inline(always)]
                || {
                    for ((p, v), g) in p.iter_mut().zip(v.iter_mut()).zip(g) {
                        let previous = (!first).then_some(*v);
                        (*p, *v) = c.element(*p, *g, previous);
                    }
                },
            )
        });
}
