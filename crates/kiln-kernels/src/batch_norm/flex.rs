//! Training-mode batch norm on Flex tensors, straight on the NCHW layout: the statistics in
//! one parallel pass per channel, the output in one pass per (image, channel) plane; the
//! backward's two per-channel sums in one pass and the input gradient in one more.
//!
//! Burn's generic batch norm builds both from tensor operations that first transpose the
//! whole activation to channels-first (a full copy) several times per layer. Here each
//! channel's sums run in an order fixed by the shape (so they do not depend on the thread
//! count), in f32 over runs of 4 values per lane and in f64 beyond, the variance around
//! the mean already found (no cancellation), and the work is split by channel or by
//! plane. The passes run under [`simd`](crate::simd) (AVX-512 where present; the same bits
//! at any width).

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, FlexDevice, TensorMetadata};
use burn::tensor::{DType, Shape, TensorData};
use rayon::prelude::*;

use crate::activation::flex::writable;
use crate::lane_sums::{self, Term};
use crate::simd::simd;
use crate::zeroed::collect_pieces;

type FlexTensor = FloatTensor<Flex>;

/// The layout of a `[N, C, ...]` activation: (images, channels, elements per plane).
fn layout(shape: &Shape) -> (usize, usize, usize) {
    let dims = shape.clone().dims::<4>();
    (dims[0], dims[1], dims[2] * dims[3])
}

/// `tensor` as a contiguous f32 tensor (no copy when it already is one).
fn contiguous_f32(tensor: FlexTensor) -> FlexTensor {
    cast(tensor, DType::F32).to_contiguous()
}

fn values(tensor: &FlexTensor) -> &[f32] {
    tensor.as_slice::<f32>().expect("a contiguous f32 tensor")
}

fn tensor(values: Vec<f32>, shape: Shape, dtype: DType) -> FlexTensor {
    cast(
        Flex::float_from_data(TensorData::new(values, shape), &FlexDevice),
        dtype,
    )
}

fn cast(tensor: FlexTensor, dtype: DType) -> FlexTensor {
    if tensor.dtype() == dtype {
        tensor
    } else {
        Flex::float_cast(tensor, dtype.into())
    }
}

/// Image `image`'s plane of channel `channel`.
#[inline(always)]
fn plane_at(x: &[f32], channels: usize, plane: usize, image: usize, channel: usize) -> &[f32] {
    &x[(image * channels + channel) * plane..][..plane]
}

/// What [`forward`] computes.
pub(crate) struct Normalized {
    /// In `x`'s dtype.
    pub output: FlexTensor,
    /// Per-channel mean and biased variance, in `gamma`'s dtype.
    pub mean: FlexTensor,
    pub variance: FlexTensor,
    /// The same statistics in f32, for the backward (a half-precision mean would shift x̂).
    pub saved_mean: FlexTensor,
    pub saved_variance: FlexTensor,
}

/// Normalises `x` `[N, C, H, W]` with its own per-channel statistics, then scales by `gamma`
/// and shifts by `beta`.
pub(crate) fn forward(
    x: FlexTensor,
    gamma: FlexTensor,
    beta: FlexTensor,
    epsilon: f64,
) -> Normalized {
    let (dtype, stats_dtype) = (x.dtype(), gamma.dtype());
    let shape = x.shape();
    let (images, channels, plane) = layout(&shape);
    let (x, gamma, beta) = (
        contiguous_f32(x),
        contiguous_f32(gamma),
        contiguous_f32(beta),
    );
    let (x, gamma, beta) = (values(&x), values(&gamma), values(&beta));
    let count = (images * plane) as f64;
    let stats: Vec<(f64, f64)> = (0..channels)
        .into_par_iter()
        .map(|channel| {
            // `lane_sums` picks its own vectors; the loops around it only add per plane.
            let mut sum = 0.0;
            for image in 0..images {
                sum += lane_sums::sum(plane_at(x, channels, plane, image, channel), Term::Value);
            }
            let mean = sum / count;
            let centre = mean as f32;
            let mut squares = 0.0;
            for image in 0..images {
                let p = plane_at(x, channels, plane, image, channel);
                squares += lane_sums::sum(p, Term::SquaredFrom(centre));
            }
            (mean, squares / count)
        })
        .collect();
    // y = (x − μ)·a + β with a = γ/√(σ²+ε).
    let affine: Vec<(f32, f32, f32)> = stats
        .iter()
        .zip(gamma.iter().zip(beta))
        .map(|(&(mean, var), (&g, &b))| {
            let scale = g as f64 / (var + epsilon).sqrt();
            (mean as f32, scale as f32, b)
        })
        .collect();
    let output = normalize(x, plane, &affine);
    let (means, variances): (Vec<f32>, Vec<f32>) =
        stats.iter().map(|&(m, v)| (m as f32, v as f32)).unzip();
    let saved_mean = tensor(means, Shape::new([channels]), DType::F32);
    let saved_variance = tensor(variances, Shape::new([channels]), DType::F32);
    Normalized {
        output: tensor(output, shape, dtype),
        mean: cast(saved_mean.clone(), stats_dtype),
        variance: cast(saved_variance.clone(), stats_dtype),
        saved_mean,
        saved_variance,
    }
}

/// `(v − mean)·scale + shift` for every element `v` of `x`, with `affine[c] = (mean, scale,
/// shift)` for channel `c`: one parallel pass over the `plane`-long planes.
fn normalize(x: &[f32], plane: usize, affine: &[(f32, f32, f32)]) -> Vec<f32> {
    let plane = plane.max(1);
    collect_pieces(x.len(), plane, |index| {
        let (mean, scale, shift) = affine[index % affine.len()];
        x[index * plane..][..plane]
            .iter()
            .map(move |&v| (v - mean) * scale + shift)
    })
}

/// Normalises `x` `[N, C, H, W]` with the given per-channel `mean` and `variance` (inference
/// mode: the running statistics), then scales by `gamma` and shifts by `beta`, in one pass.
/// Computed in f32 and returned in `x`'s dtype.
pub(crate) fn inference(
    x: FlexTensor,
    (gamma, beta): (FlexTensor, FlexTensor),
    (mean, variance): (FlexTensor, FlexTensor),
    epsilon: f64,
) -> FlexTensor {
    let dtype = x.dtype();
    let shape = x.shape();
    let (_, _, plane) = layout(&shape);
    let [x, gamma, beta, mean, variance] = [x, gamma, beta, mean, variance].map(contiguous_f32);
    let affine: Vec<(f32, f32, f32)> = values(&mean)
        .iter()
        .zip(values(&variance))
        .zip(values(&gamma).iter().zip(values(&beta)))
        .map(|((&m, &var), (&g, &b))| {
            let scale = g as f64 / (var as f64 + epsilon).sqrt();
            (m, scale as f32, b)
        })
        .collect();
    tensor(normalize(values(&x), plane, &affine), shape, dtype)
}

/// Gradients of [`forward`] with respect to `x`, `gamma` and `beta` (the last in
/// `beta_dtype`), given the output gradient and the forward's saved statistics.
pub(crate) fn backward(
    x: FlexTensor,
    gamma: FlexTensor,
    (mean, variance): (FlexTensor, FlexTensor),
    epsilon: f64,
    grad: FlexTensor,
    beta_dtype: DType,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let (dtype, gamma_dtype) = (x.dtype(), gamma.dtype());
    let shape = x.shape();
    let (images, channels, plane) = layout(&shape);
    let (x_tensor, grad_tensor) = (contiguous_f32(x), contiguous_f32(grad));
    let (gamma, mean, variance) = (
        contiguous_f32(gamma),
        contiguous_f32(mean),
        contiguous_f32(variance),
    );
    let (x, grad) = (values(&x_tensor), values(&grad_tensor));
    let (gamma, mean, variance) = (values(&gamma), values(&mean), values(&variance));
    let inv_std: Vec<f64> = variance
        .iter()
        .map(|&v| 1.0 / (v as f64 + epsilon).sqrt())
        .collect();
    // Per channel: Σ dy and Σ dy·x̂.
    let sums: Vec<(f64, f64)> = (0..channels)
        .into_par_iter()
        .map(|channel| {
            let (m, s) = (mean[channel], inv_std[channel]);
            let (mut dy, mut dyx) = (0.0, 0.0);
            for image in 0..images {
                let (a, b) = lane_sums::gradient_sums(
                    plane_at(x, channels, plane, image, channel),
                    plane_at(grad, channels, plane, image, channel),
                    m,
                );
                dy += a;
                dyx += b * s;
            }
            (dy, dyx)
        })
        .collect();
    let count = (images * plane) as f64;
    // dx = γ/σ · (dy − Σdy/M − x̂·Σ(dy·x̂)/M), written as dy·a + (x − μ)·b + c per channel.
    let coefficients: Vec<(f32, f32, f32, f32)> = (0..channels)
        .map(|c| {
            let (sum_dy, sum_dyx) = sums[c];
            let scale = gamma[c] as f64 * inv_std[c];
            let slope = -scale * inv_std[c] * sum_dyx / count;
            let offset = -scale * sum_dy / count;
            (mean[c], scale as f32, slope as f32, offset as f32)
        })
        .collect();
    let dx_of = |g: f32, v: f32, (m, a, b, c): (f32, f32, f32, f32)| g * a + (v - m) * b + c;
    // The output gradient is consumed here: when nothing else holds it, dx overwrites it
    // (the same arithmetic per element; no zeroed buffer to allocate and fill).
    let input_grad = match writable(grad_tensor) {
        Ok(mut dy) => {
            dy.storage_mut::<f32>()
                .par_chunks_mut(plane)
                .zip(x.par_chunks(plane))
                .enumerate()
                .for_each(|(index, (gs, xs))| {
                    let k = coefficients[index % channels];
                    simd(
                        #[inline(always)]
                        || {
                            gs.iter_mut()
                                .zip(xs)
                                .for_each(|(g, &v)| *g = dx_of(*g, v, k))
                        },
                    );
                });
            cast(dy, dtype)
        }
        Err(dy) => {
            let grad = values(&dy);
            let plane = plane.max(1);
            let input_grad = collect_pieces(x.len(), plane, |index| {
                let k = coefficients[index % channels];
                let (xs, gs) = (
                    &x[index * plane..][..plane],
                    &grad[index * plane..][..plane],
                );
                xs.iter().zip(gs).map(move |(&v, &g)| dx_of(g, v, k))
            });
            tensor(input_grad, shape.clone(), dtype)
        }
    };
    let (beta_grad, gamma_grad): (Vec<f32>, Vec<f32>) = sums
        .iter()
        .map(|&(dy, dyx)| (dy as f32, dyx as f32))
        .unzip();
    (
        input_grad,
        tensor(gamma_grad, Shape::new([channels]), gamma_dtype),
        tensor(beta_grad, Shape::new([channels]), beta_dtype),
    )
}
