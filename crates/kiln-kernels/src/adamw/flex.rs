//! AdamW's update on f32 Flex tensors: one pass over the parameter, its gradient and its
//! moments, split into pieces over the caller's rayon pool, in place where the buffers are
//! not shared.
//!
//! Burn's `AdamW` composes the same update from about fourteen element-wise operations, each
//! a pass (and a buffer) of its own on one thread. Each element here gets Burn's formula,
//! operation for operation (Rust never fuses `a * b + c`), so the results are Burn's bit for
//! bit, at any thread count and vector width.

use burn::backend::Flex;
use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use rayon::prelude::*;

use super::rule::{AdamWCoefficients, AdamWDecay};
use crate::activation::flex::readable;
use crate::simd::simd;
use crate::update_buffer::UpdateBuffer;

type FlexTensor = FloatTensor<Flex>;

/// Elements per parallel piece.
const PIECE: usize = 1 << 14;

/// A parameter's state after a step: `(param, moment_1, moment_2, max_moment_2)`, the last
/// `Some` exactly under AMSGrad.
pub(crate) type Stepped = (FlexTensor, FlexTensor, FlexTensor, Option<FlexTensor>);

/// One AdamW step of `param` given `grad` (same shape; another float dtype is read as f32)
/// and the previous step's `moments` (`None` on the first step); `max_moment_2` is AMSGrad's
/// running maximum, read only under AMSGrad (`None`: it starts as the second moment).
///
/// # Panics
///
/// If the shapes differ.
pub(crate) fn step(
    param: FlexTensor,
    grad: FlexTensor,
    moments: Option<(FlexTensor, FlexTensor)>,
    max_moment_2: Option<FlexTensor>,
    c: AdamWCoefficients,
) -> Stepped {
    let shape = param.shape();
    assert_eq!(shape, grad.shape(), "adamw: gradient shape");
    let grad = readable(grad);
    let g = grad.as_slice::<f32>().expect("contiguous f32");
    let mut param = UpdateBuffer::new(param);
    let first = moments.is_none();
    let (mut m1, mut m2) = match moments {
        Some((m1, m2)) => {
            assert_eq!(m1.shape(), shape, "adamw: first moment shape");
            assert_eq!(m2.shape(), shape, "adamw: second moment shape");
            (UpdateBuffer::new(m1), UpdateBuffer::new(m2))
        }
        None => (
            UpdateBuffer::zeros(shape.clone()),
            UpdateBuffer::zeros(shape.clone()),
        ),
    };
    let pieces = param
        .values()
        .par_chunks_mut(PIECE)
        .zip(m1.values().par_chunks_mut(PIECE))
        .zip(m2.values().par_chunks_mut(PIECE))
        .zip(g.par_chunks(PIECE));
    let max = if c.amsgrad {
        let fresh = max_moment_2.is_none();
        let mut max = match max_moment_2 {
            Some(max) => {
                assert_eq!(max.shape(), shape, "adamw: max second moment shape");
                UpdateBuffer::new(max)
            }
            None => UpdateBuffer::zeros(shape.clone()),
        };
        pieces
            .zip(max.values().par_chunks_mut(PIECE))
            .for_each(|((((p, m1), m2), g), max)| {
                simd(
                    #[inline(always)]
                    || {
                        for ((((p, m1), m2), g), max) in p
                            .iter_mut()
                            .zip(m1.iter_mut())
                            .zip(m2.iter_mut())
                            .zip(g)
                            .zip(max)
                        {
                            let u = c.element(
                                *p,
                                *g,
                                (!first).then_some((*m1, *m2)),
                                (!fresh).then_some(*max),
                            );
                            (*p, *m1, *m2, *max) =
                                (u.param, u.moment_1, u.moment_2, u.max_moment_2);
                        }
                    },
                )
            });
        Some(max.finish())
    } else if let Some(keep) = plain_keep(&c) {
        // The common case (no AMSGrad, no cautious decay) without a branch per element, so
        // that the loop vectorises: division and square root are slow one at a time.
        pieces.for_each(|(((p, m1), m2), g)| {
            simd(
                #[inline(always)]
                || {
                    let lanes = p.iter_mut().zip(m1.iter_mut()).zip(m2.iter_mut()).zip(g);
                    if first {
                        for (((p, m1), m2), &g) in lanes {
                            (*m1, *m2) = (g * c.factor_1, (g * g) * c.factor_2);
                            *p = plain_param(&c, keep, *p, *m1, *m2);
                        }
                    } else {
                        for (((p, m1), m2), &g) in lanes {
                            *m1 = *m1 * c.beta_1 + g * c.factor_1;
                            *m2 = *m2 * c.beta_2 + (g * g) * c.factor_2;
                            *p = plain_param(&c, keep, *p, *m1, *m2);
                        }
                    }
                },
            )
        });
        None
    } else {
        pieces.for_each(|(((p, m1), m2), g)| {
            simd(
                #[inline(always)]
                || {
                    for (((p, m1), m2), g) in
                        p.iter_mut().zip(m1.iter_mut()).zip(m2.iter_mut()).zip(g)
                    {
                        let u = c.element(*p, *g, (!first).then_some((*m1, *m2)), None);
                        (*p, *m1, *m2) = (u.param, u.moment_1, u.moment_2);
                    }
                },
            )
        });
        None
    };
    (param.finish(), m1.finish(), m2.finish(), max)
}

/// The factor a parameter is multiplied by before the step when the rule needs no branch per
/// element (no AMSGrad, no cautious decay); no decay is a factor of 1 (`p · 1 = p` exactly,
/// as Burn's `AdamW` leaves the parameter as it is).
fn plain_keep(c: &AdamWCoefficients) -> Option<f32> {
    match (c.amsgrad, c.decay) {
        (false, AdamWDecay::None) => Some(1.0),
        (false, AdamWDecay::Scaled { keep }) => Some(keep),
        _ => None,
    }
}

/// The new parameter from the new moments, as [`AdamWCoefficients::element`] computes it
/// (the same `delta`).
#[inline(always)]
fn plain_param(c: &AdamWCoefficients, keep: f32, param: f32, m1: f32, m2: f32) -> f32 {
    param * keep - c.delta(m1, m2) * c.lr
}
