//! Validation.

use kiln_core::{Forward, ImageClassifier};
use kiln_data::{Batch, BatchSource, DataLoader};

use crate::{Classification, Objective, TrainError, objective_loss};

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

/// Evaluates `model` (in inference mode: call `model.valid()` first) on epoch 0 of `loader`
/// ([`evaluate_with`] for [`Classification`]).
pub fn evaluate<M: ImageClassifier>(
    model: &M,
    loader: &mut DataLoader,
) -> Result<Evaluation, TrainError> {
    evaluate_with(model, &Classification, loader)
}

/// Evaluates `model` (in inference mode: call `model.valid()` first) for `objective` on
/// epoch 0 of `source`, in f32: the mean loss per sample and the fraction the objective
/// counts as right.
pub fn evaluate_with<M, O, S>(
    model: &M,
    objective: &O,
    source: &mut S,
) -> Result<Evaluation, TrainError>
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
    S: BatchSource<Batch = O::Batch> + ?Sized,
{
    let (mut loss_sum, mut correct, mut samples) = (0.0f64, 0usize, 0usize);
    for batch in source.batches(0, 0) {
        let batch = batch?;
        let n = batch.samples();
        let output = model.forward(objective.input(&batch));
        loss_sum +=
            f64::from(objective_loss(objective, &output, &batch).into_scalar::<f32>()) * n as f64;
        correct += objective.correct(&output, &batch);
        samples += n;
    }
    let samples_f = samples.max(1) as f64;
    Ok(Evaluation {
        loss: (loss_sum / samples_f) as f32,
        accuracy: (correct as f64 / samples_f) as f32,
        samples,
    })
}
