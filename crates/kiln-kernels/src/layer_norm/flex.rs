//! Layer norm on f32 rows: statistics and output in one pass per row, the backward in one
//! more, rows split into fixed pieces over the rayon pool.
//!
//! Flex composes layer norm from nine single-threaded element-wise operations (mean, centre,
//! square, mean, add, square root, divide, scale, shift) and autodiff records each. Here a
//! row's mean, variance and output come from one thread; the scale's and shift's gradients
//! are summed per piece of rows and the pieces added in order, so the results do not depend
//! on the thread count.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, FlexDevice, TensorMetadata};
use burn::tensor::{Shape, TensorData};
use rayon::prelude::*;

use crate::activation::flex::readable;

type FlexTensor = FloatTensor<Flex>;

/// Rows per parallel piece: the pieces, not the threads, fix the order of the parameter
/// gradients' sums.
const ROWS: usize = 32;

/// What the backward needs: the input and scale (f32, contiguous) and each row's mean and
/// reciprocal standard deviation.
#[derive(Clone, Debug)]
pub(crate) struct Saved {
    pub input: FlexTensor,
    pub gamma: FlexTensor,
    pub mean: Vec<f32>,
    pub inverse_std: Vec<f32>,
}

fn values(tensor: &FlexTensor) -> &[f32] {
    tensor
        .as_slice::<f32>()
        .expect("a contiguous f32 tensor (made so by `readable`)")
}

fn from_vec(values: Vec<f32>, shape: Shape) -> FlexTensor {
    Flex::float_from_data(TensorData::new(values, shape), &FlexDevice)
}

/// `(x − mean)/√(variance + epsilon)·gamma + beta` over the last dimension of `input`
/// (biased variance, as Burn's), with what the backward needs.
pub(crate) fn forward(
    input: FlexTensor,
    gamma: FlexTensor,
    beta: FlexTensor,
    epsilon: f64,
) -> (FlexTensor, Saved) {
    let (input, gamma, beta) = (readable(input), readable(gamma), readable(beta));
    let (x, g, b) = (values(&input), values(&gamma), values(&beta));
    let width = g.len().max(1);
    let rows = x.len() / width;
    let (mut out, mut mean, mut inverse_std) =
        (vec![0.0; x.len()], vec![0.0; rows], vec![0.0; rows]);
    let epsilon = epsilon as f32;
    out.par_chunks_mut(ROWS * width)
        .zip(mean.par_chunks_mut(ROWS))
        .zip(inverse_std.par_chunks_mut(ROWS))
        .enumerate()
        .for_each(|(piece, ((out, mean), inverse_std))| {
            let x = &x[piece * ROWS * width..];
            for (r, out) in out.chunks_mut(width).enumerate() {
                let row = &x[r * width..(r + 1) * width];
                let m = row.iter().sum::<f32>() / width as f32;
                let variance = row.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / width as f32;
                let s = 1.0 / (variance + epsilon).sqrt();
                for (((o, v), g), b) in out.iter_mut().zip(row).zip(g).zip(b) {
                    *o = (v - m) * s * g + b;
                }
                (mean[r], inverse_std[r]) = (m, s);
            }
        });
    let output = from_vec(out, input.shape());
    let saved = Saved {
        input,
        gamma,
        mean,
        inverse_std,
    };
    (output, saved)
}

/// The gradients of the input, the scale and the shift from the output's gradient `grad`.
pub(crate) fn backward(saved: &Saved, grad: FlexTensor) -> [FlexTensor; 3] {
    let grad = readable(grad);
    let (x, g, dy) = (values(&saved.input), values(&saved.gamma), values(&grad));
    let width = g.len().max(1);
    let mut dx = vec![0.0; x.len()];
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(ROWS * width)
        .enumerate()
        .map(|(piece, dx)| {
            let (mut d_gamma, mut d_beta) = (vec![0.0; width], vec![0.0; width]);
            let mut scaled = vec![0.0; width];
            for (r, dx) in dx.chunks_mut(width).enumerate() {
                let row = piece * ROWS + r;
                let at = row * width..(row + 1) * width;
                let (x, dy) = (&x[at.clone()], &dy[at]);
                let (m, s) = (saved.mean[row], saved.inverse_std[row]);
                let (mut sum, mut dot) = (0.0f32, 0.0f32);
                for (j, (v, d)) in x.iter().zip(dy).enumerate() {
                    let normed = (v - m) * s;
                    scaled[j] = d * g[j];
                    sum += scaled[j];
                    dot += scaled[j] * normed;
                    d_gamma[j] += d * normed;
                    d_beta[j] += d;
                }
                let (sum, dot) = (sum / width as f32, dot / width as f32);
                for (j, (out, v)) in dx.iter_mut().zip(x).enumerate() {
                    *out = s * (scaled[j] - sum - (v - m) * s * dot);
                }
            }
            (d_gamma, d_beta)
        })
        .collect();
    let (mut d_gamma, mut d_beta) = (vec![0.0; width], vec![0.0; width]);
    for (pg, pb) in &partials {
        for j in 0..width {
            d_gamma[j] += pg[j];
            d_beta[j] += pb[j];
        }
    }
    let parameter = saved.gamma.shape();
    [
        from_vec(dx, saved.input.shape()),
        from_vec(d_gamma, parameter.clone()),
        from_vec(d_beta, parameter),
    ]
}
