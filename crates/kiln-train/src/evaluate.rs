//! Validation.

use kiln_core::ImageClassifier;
use kiln_data::DataLoader;

use crate::TrainError;
use crate::step::{classification_loss, count_correct};

/// Loss and accuracy over a validation epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean loss per sample.
    pub loss: f32,
    /// Fraction correct.
    pub accuracy: f32,
    /// Samples evaluated.
    pub samples: usize,
}

/// Evaluates `model` (in inference mode: call `model.valid()` first) on epoch 0 of `loader`.
pub fn evaluate<M: ImageClassifier>(
    model: &M,
    loader: &mut DataLoader,
) -> Result<Evaluation, TrainError> {
    let (mut loss_sum, mut correct, mut samples) = (0.0f64, 0usize, 0usize);
    for batch in loader.epoch(0) {
        let batch = batch?;
        let n = batch.indices.len();
        let logits = model.forward_logits(batch.images);
        loss_sum += f64::from(
            classification_loss(logits.clone(), batch.labels.clone()).into_scalar::<f32>(),
        ) * n as f64;
        correct += count_correct(logits, batch.labels);
        samples += n;
    }
    let samples_f = samples.max(1) as f64;
    Ok(Evaluation {
        loss: (loss_sum / samples_f) as f32,
        accuracy: (correct as f64 / samples_f) as f32,
        samples,
    })
}
