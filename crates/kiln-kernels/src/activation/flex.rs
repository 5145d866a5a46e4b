//! ReLU, a residual addition followed by ReLU, and GELU on f32 Flex tensors: element-wise passes
//! split into pieces over the caller's rayon pool, in place when the tensor is not shared.
//!
//! Flex runs its element-wise operations on one thread, so on two threads a ResNet step's
//! ReLUs and residual additions left the second core idle (a tenth of the busiest thread's
//! samples were such serial operations). ReLU's elements get Flex's own formula, so they are
//! Flex's bit for bit; GELU's get Flex's formula with a vectorisable `erf` (within 2.5e-7 of
//! libm's). Either gives the same bits at any thread count and vector width.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, FlexDevice, TensorMetadata};
use burn::tensor::{DType, FloatDType, TensorData};
use rayon::prelude::*;

use super::erf;
use crate::simd::simd;
use crate::zeroed::collect_pieces;

type FlexTensor = FloatTensor<Flex>;

/// Elements per parallel piece: large enough that splitting costs little next to the pass.
const PIECE: usize = 1 << 14;

/// Flex's ReLU of one element: NaN propagates (as PyTorch's does), everything not above zero
/// becomes zero.
#[inline(always)]
fn relu_of(x: f32) -> f32 {
    if x.is_nan() || x > 0.0 { x } else { 0.0 }
}

/// Flex's ReLU gradient of one element: kept where the output is above zero or NaN.
#[inline(always)]
fn masked(output: f32, grad: f32) -> f32 {
    if output.is_nan() || output > 0.0 {
        grad
    } else {
        0.0
    }
}

/// GELU of one element, `0.5·x·(1 + erf(x/√2))`, in Flex's order of operations with
/// [`erf`](super::erf)'s vectorisable `erf`.
#[inline(always)]
fn gelu_of(x: f32) -> f32 {
    0.5 * x * (1.0 + erf::erf(x / core::f32::consts::SQRT_2))
}

/// GELU's gradient of one element, `g·(Φ(x) + x·φ(x))`, as Flex composes it, with
/// [`erf`](super::erf)'s `erf` and `exp`.
#[inline(always)]
fn gelu_gradient(x: f32, grad: f32) -> f32 {
    let inverse_sqrt_2pi: f32 = 1.0 / (2.0 * core::f32::consts::PI).sqrt();
    let cdf = 0.5 * (1.0 + erf::erf(x / core::f32::consts::SQRT_2));
    let pdf = inverse_sqrt_2pi * erf::exp(-0.5 * x * x);
    grad * (cdf + x * pdf)
}

/// The elements of a contiguous f32 tensor.
fn values(tensor: &FlexTensor) -> &[f32] {
    tensor
        .as_slice::<f32>()
        .expect("a contiguous f32 tensor (checked by the caller)")
}

/// `tensor` itself when its buffer is its own, contiguous from the start (so it can be
/// overwritten), else `None`.
pub(crate) fn writable(mut tensor: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    let whole = tensor.layout().contiguous_offsets() == Some((0, tensor.shape().num_elements()));
    if whole && tensor.try_storage_mut::<f32>().is_some() {
        Ok(tensor)
    } else {
        Err(tensor)
    }
}

/// `tensor` as an f32 tensor whose elements lie in one contiguous run (copied only when it
/// is not one already: a strided view, or another dtype).
pub(crate) fn readable(tensor: FlexTensor) -> FlexTensor {
    let tensor = if tensor.dtype() == DType::F32 {
        tensor
    } else {
        Flex::float_cast(tensor, FloatDType::F32)
    };
    if tensor.as_slice::<f32>().is_some() {
        tensor
    } else {
        tensor.to_contiguous()
    }
}

/// `dst[i] = f(dst[i], src[i])` (with `src` = `dst` read before writing) in pieces over the
/// pool, under the SIMD dispatch.
pub(crate) fn each_in_place(
    dst: &mut [f32],
    src: Option<&[f32]>,
    f: impl Fn(f32, f32) -> f32 + Sync,
) {
    match src {
        None => dst.par_chunks_mut(PIECE).for_each(|d| {
            simd(
                #[inline(always)]
                || {
                    for v in d.iter_mut() {
                        *v = f(*v, 0.0);
                    }
                },
            )
        }),
        Some(src) => dst
            .par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(|(d, s)| {
                simd(
                    #[inline(always)]
                    || {
                        for (v, s) in d.iter_mut().zip(s) {
                            *v = f(*v, *s);
                        }
                    },
                )
            }),
    }
}

/// `out[i] = f(a[i], b[i])` into a new buffer, in pieces over the pool.
fn each_into(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    assert_eq!(a.len(), b.len(), "each_into: lengths differ");
    collect_pieces(a.len(), PIECE, |index| {
        let start = index * PIECE;
        a[start..].iter().zip(&b[start..]).map(|(&a, &b)| f(a, b))
    })
}

fn from_vec(values: Vec<f32>, like: &FlexTensor) -> FlexTensor {
    Flex::float_from_data(TensorData::new(values, like.shape()), &FlexDevice)
}

/// `max(x, 0)` element-wise (Flex's ReLU) of an f32 tensor.
pub(crate) fn relu(x: FlexTensor) -> FlexTensor {
    match writable(readable(x)) {
        Ok(mut x) => {
            each_in_place(x.storage_mut::<f32>(), None, |v, _| relu_of(v));
            x
        }
        Err(x) => {
            let out = each_into(values(&x), values(&x), |v, _| relu_of(v));
            from_vec(out, &x)
        }
    }
}

/// GELU (the exact, erf form) element-wise of an f32 tensor, in place when `x` is not shared
/// (under autodiff the backward step keeps `x`, so it is shared and stays intact: then a copy
/// is overwritten, so that both paths run the same vectorised loop).
pub(crate) fn gelu(x: FlexTensor) -> FlexTensor {
    let mut out = match writable(readable(x)) {
        Ok(x) => x,
        Err(x) => from_vec(values(&x).to_vec(), &x),
    };
    out.storage_mut::<f32>()
        .par_chunks_mut(PIECE)
        .for_each(|piece| {
            // `gelu_of` inlined into the dispatched loop, so that the loop vectorises.
            simd(
                #[inline(always)]
                || {
                    for v in piece.iter_mut() {
                        *v = gelu_of(*v);
                    }
                },
            )
        });
    out
}

/// The gradient through a GELU of `input` (one of this module's f32 contiguous tensors).
pub(crate) fn gelu_backward(input: &FlexTensor, grad: FlexTensor) -> FlexTensor {
    let mut grad = match writable(readable(grad)) {
        Ok(grad) => grad,
        Err(grad) => from_vec(values(&grad).to_vec(), &grad),
    };
    grad.storage_mut::<f32>()
        .par_chunks_mut(PIECE)
        .zip(values(input).par_chunks(PIECE))
        .for_each(|(grads, inputs)| {
            simd(
                #[inline(always)]
                || {
                    for (g, x) in grads.iter_mut().zip(inputs) {
                        *g = gelu_gradient(*x, *g);
                    }
                },
            )
        });
    grad
}

/// `relu(a + b)` for f32 tensors of one shape, in one pass.
pub(crate) fn add_relu(a: FlexTensor, b: FlexTensor) -> FlexTensor {
    let (a, b) = (readable(a), readable(b));
    match writable(a) {
        Ok(mut a) => {
            each_in_place(a.storage_mut::<f32>(), Some(values(&b)), |a, b| {
                relu_of(a + b)
            });
            a
        }
        Err(a) => match writable(b) {
            // Addition commutes bit for bit.
            Ok(mut b) => {
                each_in_place(b.storage_mut::<f32>(), Some(values(&a)), |b, a| {
                    relu_of(a + b)
                });
                b
            }
            Err(b) => {
                let out = each_into(values(&a), values(&b), |a, b| relu_of(a + b));
                from_vec(out, &a)
            }
        },
    }
}

/// The gradient through a ReLU whose output was `output`: `grad` where the output is above
/// zero (or NaN), zero elsewhere (Flex's `relu_backward`); `output` is one of this module's
/// results (f32, contiguous).
pub(crate) fn relu_backward(output: &FlexTensor, grad: FlexTensor) -> FlexTensor {
    match writable(readable(grad)) {
        Ok(mut grad) => {
            each_in_place(grad.storage_mut::<f32>(), Some(values(output)), |g, out| {
                masked(out, g)
            });
            grad
        }
        Err(grad) => {
            let out = each_into(values(output), values(&grad), masked);
            from_vec(out, output)
        }
    }
}
