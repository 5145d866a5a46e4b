//! Producing the gradients of one training step.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor};
use kiln_core::ImageClassifier;
use kiln_data::ImageBatch;

use crate::TrainError;

/// What one gradient step produced.
#[derive(Debug)]
pub struct StepOutput {
    /// The gradients to apply (already synchronised, for a distributed step).
    pub grads: GradientsParams,
    /// Mean loss over this replica's batch.
    pub loss: f32,
    /// Correctly classified samples in this replica's batch.
    pub correct: usize,
    /// Samples in this replica's batch.
    pub samples: usize,
}

/// How a training step turns a batch into gradients.
///
/// [`LocalStep`] is plain forward and backward on one device. The data-parallel runtime
/// provides a step that also synchronises gradients with the other replicas; the trainer's
/// loop is the same for both.
pub trait GradientStep<M: ImageClassifier> {
    /// Computes the gradients of `model` on `batch` at global step `step`.
    fn gradients(
        &mut self,
        model: &M,
        batch: ImageBatch,
        step: usize,
    ) -> Result<StepOutput, TrainError>;
}

/// Forward and backward on one device.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalStep;

/// Mean cross-entropy of `logits` against `labels`.
pub fn classification_loss(logits: Tensor<2>, labels: Tensor<1, Int>) -> Tensor<1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}

/// Correct predictions among `logits` for `labels`.
pub(crate) fn count_correct(logits: Tensor<2>, labels: Tensor<1, Int>) -> usize {
    let [batch, _] = logits.dims();
    let predicted = logits.argmax(1).reshape([batch]);
    predicted.equal(labels).int().sum().into_scalar::<i64>() as usize
}

impl<M: ImageClassifier> GradientStep<M> for LocalStep {
    fn gradients(
        &mut self,
        model: &M,
        batch: ImageBatch,
        _step: usize,
    ) -> Result<StepOutput, TrainError> {
        let samples = batch.indices.len();
        let logits = model.forward_logits(batch.images);
        let loss = classification_loss(logits.clone(), batch.labels.clone());
        let grads = GradientsParams::from_grads(loss.backward(), model);
        Ok(StepOutput {
            grads,
            loss: loss.into_scalar::<f32>(),
            correct: count_correct(logits.detach(), batch.labels),
            samples,
        })
    }
}
