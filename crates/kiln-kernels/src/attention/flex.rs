//! Causal self-attention on f32 rows `[batch, time, heads·dim]`, one batch element per piece
//! of the rayon pool, every head's products on gemm's kernels.
//!
//! Each head reads its columns of the query, key and value rows in place (no head-major
//! copies), writes its columns of the output, and keeps only the log-sum-exp of each
//! softmax row: the backward recomputes the probabilities from it (one more `Q·Kᵀ`, as
//! FlashAttention's backward does), so the step holds `time` floats per head, not
//! `time²`. A batch element's sums run in one thread in an order fixed by the shapes, so the
//! results do not depend on the thread count.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, FlexDevice, TensorMetadata};
use burn::tensor::TensorData;
use rayon::prelude::*;

use crate::activation::flex::readable;
use crate::gemm::{Matrix, matmul_into};

type FlexTensor = FloatTensor<Flex>;

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heads {
    /// Sequences in the batch.
    pub batch: usize,
    /// Positions per sequence.
    pub time: usize,
    /// Attention heads.
    pub heads: usize,
    /// Each head's width.
    pub dim: usize,
}

impl Heads {
    /// The sizes of `query` `[batch, time, width]` split into `heads`.
    fn of(query: &FlexTensor, heads: usize) -> Self {
        let dims = query.shape().dims::<3>();
        Self {
            batch: dims[0],
            time: dims[1],
            heads,
            dim: dims[2] / heads,
        }
    }

    fn width(&self) -> usize {
        self.heads * self.dim
    }

    /// Elements of one sequence's rows.
    fn sequence(&self) -> usize {
        self.time * self.width()
    }

    /// `1/√dim`, the scores' scale.
    fn scale(&self) -> f32 {
        1.0 / (self.dim as f32).sqrt()
    }

    /// Head `head`'s columns of a sequence's rows: a `time × dim` matrix from its offset.
    fn columns<'a>(&self, rows: &'a [f32], head: usize) -> (&'a [f32], Matrix) {
        (&rows[head * self.dim..], self.block())
    }

    fn block(&self) -> Matrix {
        Matrix {
            rows: self.time,
            cols: self.dim,
            row_stride: self.width(),
            col_stride: 1,
        }
    }

    fn square(&self) -> Matrix {
        Matrix::row_major(self.time, self.time)
    }
}

/// What the backward needs: the inputs and output (f32, contiguous) and each softmax row's
/// log-sum-exp `[batch, heads, time]`.
#[derive(Clone, Debug)]
pub(crate) struct Saved {
    pub query: FlexTensor,
    pub key: FlexTensor,
    pub value: FlexTensor,
    pub output: FlexTensor,
    pub log_sum_exp: Vec<f32>,
    pub heads: Heads,
}

fn values(tensor: &FlexTensor) -> &[f32] {
    tensor
        .as_slice::<f32>()
        .expect("a contiguous f32 tensor (made so by `readable`)")
}

fn from_vec(values: Vec<f32>, like: &FlexTensor) -> FlexTensor {
    Flex::float_from_data(TensorData::new(values, like.shape()), &FlexDevice)
}

/// `scores` (`time × time`, `Q·Kᵀ`) becomes the causal softmax of `scale·scores`: row `i`
/// over columns `0..=i`, zeros after; `log_sum_exp[i]` gets the row's log-sum-exp.
fn causal_softmax(scores: &mut [f32], time: usize, scale: f32, log_sum_exp: &mut [f32]) {
    for (i, row) in scores.chunks_mut(time).enumerate() {
        let (seen, future) = row.split_at_mut(i + 1);
        let mut max = f32::NEG_INFINITY;
        for s in seen.iter_mut() {
            *s *= scale;
            max = max.max(*s);
        }
        let mut sum = 0.0;
        for s in seen.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        for s in seen.iter_mut() {
            *s /= sum;
        }
        future.fill(0.0);
        log_sum_exp[i] = max + sum.ln();
    }
}

/// The forward: the output rows `[batch, time, width]` and what the backward needs.
pub(crate) fn forward(
    query: FlexTensor,
    key: FlexTensor,
    value: FlexTensor,
    heads: usize,
) -> Saved {
    let (query, key, value) = (readable(query), readable(key), readable(value));
    let shape = Heads::of(&query, heads);
    let (q, k, v) = (values(&query), values(&key), values(&value));
    let mut output = vec![0.0; q.len()];
    let mut log_sum_exp = vec![0.0; shape.batch * shape.heads * shape.time];
    let sequence = shape.sequence();
    output
        .par_chunks_mut(sequence.max(1))
        .zip(log_sum_exp.par_chunks_mut((shape.heads * shape.time).max(1)))
        .enumerate()
        .for_each(|(b, (out, lse))| {
            let rows = b * sequence..(b + 1) * sequence;
            let (q, k, v) = (&q[rows.clone()], &k[rows.clone()], &v[rows]);
            let mut scores = vec![0.0; shape.time * shape.time];
            for h in 0..shape.heads {
                let (keys, block) = shape.columns(k, h);
                matmul_into(
                    (&mut scores, shape.square()),
                    false,
                    shape.columns(q, h),
                    (keys, block.transposed()),
                    false,
                );
                let lse = &mut lse[h * shape.time..(h + 1) * shape.time];
                causal_softmax(&mut scores, shape.time, shape.scale(), lse);
                matmul_into(
                    (&mut out[h * shape.dim..], shape.block()),
                    false,
                    (&scores, shape.square()),
                    shape.columns(v, h),
                    false,
                );
            }
        });
    let output = from_vec(output, &query);
    Saved {
        query,
        key,
        value,
        output,
        log_sum_exp,
        heads: shape,
    }
}

/// The gradients of the query, key and value rows from the output's gradient `grad`.
pub(crate) fn backward(saved: &Saved, grad: FlexTensor) -> [FlexTensor; 3] {
    let grad = readable(grad);
    let shape = saved.heads;
    let (q, k, v) = (
        values(&saved.query),
        values(&saved.key),
        values(&saved.value),
    );
    let (o, d_out) = (values(&saved.output), values(&grad));
    let sequence = shape.sequence().max(1);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; q.len()], vec![0.0; q.len()]);
    let (time, scale) = (shape.time, shape.scale());
    dq.par_chunks_mut(sequence)
        .zip(dk.par_chunks_mut(sequence))
        .zip(dv.par_chunks_mut(sequence))
        .enumerate()
        .for_each(|(b, ((dq, dk), dv))| {
            let rows = b * sequence..(b + 1) * sequence;
            let (q, k, v) = (&q[rows.clone()], &k[rows.clone()], &v[rows.clone()]);
            let (o, d_out) = (&o[rows.clone()], &d_out[rows]);
            let (mut probabilities, mut d_scores) =
                (vec![0.0; time * time], vec![0.0; time * time]);
            for h in 0..shape.heads {
                let lse = &saved.log_sum_exp[(b * shape.heads + h) * time..][..time];
                let (keys, key_block) = shape.columns(k, h);
                let (vals, value_block) = shape.columns(v, h);
                matmul_into(
                    (&mut probabilities, shape.square()),
                    false,
                    shape.columns(q, h),
                    (keys, key_block.transposed()),
                    false,
                );
                for (i, row) in probabilities.chunks_mut(time).enumerate() {
                    let (seen, future) = row.split_at_mut(i + 1);
                    for p in seen.iter_mut() {
                        *p = (*p * scale - lse[i]).exp();
                    }
                    future.fill(0.0);
                }
                // dV = Pᵀ·dO, dP = dO·Vᵀ.
                let head_grad = shape.columns(d_out, h);
                let square = shape.square();
                matmul_into(
                    (&mut dv[h * shape.dim..], shape.block()),
                    false,
                    (&probabilities, square.transposed()),
                    head_grad,
                    false,
                );
                matmul_into(
                    (&mut d_scores, square),
                    false,
                    head_grad,
                    (vals, value_block.transposed()),
                    false,
                );
                // dS = P ∘ (dP − rowsum(dO ∘ O)), scaled as the scores were.
                for (i, (d_row, p_row)) in d_scores
                    .chunks_mut(time)
                    .zip(probabilities.chunks(time))
                    .enumerate()
                {
                    let at = i * shape.width() + h * shape.dim;
                    let dot: f32 = d_out[at..at + shape.dim]
                        .iter()
                        .zip(&o[at..at + shape.dim])
                        .map(|(g, o)| g * o)
                        .sum();
                    for (d, p) in d_row.iter_mut().zip(p_row) {
                        *d = p * (*d - dot) * scale;
                    }
                }
                // dQ = dS·K, dK = dSᵀ·Q.
                matmul_into(
                    (&mut dq[h * shape.dim..], shape.block()),
                    false,
                    (&d_scores, square),
                    (keys, key_block),
                    false,
                );
                matmul_into(
                    (&mut dk[h * shape.dim..], shape.block()),
                    false,
                    (&d_scores, square.transposed()),
                    shape.columns(q, h),
                    false,
                );
            }
        });
    [dq, dk, dv].map(|values| from_vec(values, &saved.query))
}
