//! Gradient accumulation over micro-batches on one device.

use burn::module::Module;
use burn::optim::GradientsParams;
use kiln_amp::MixedPrecision;
use kiln_core::{FlatLayout, Forward, GradWriter, grads_from_flat, param_infos};
use kiln_data::Batch;

use crate::{MeanGradient, Objective, StepMetrics, StepOutput, TrainError, forward_backward_with};

/// Sums weighted gradients of micro-batches in one f32 buffer, for [`MeanGradient`] to turn
/// into the mean gradient over all their samples: exactly one large batch's gradient.
#[derive(Debug)]
pub(crate) struct Accumulator {
    layout: FlatLayout,
    flat: Vec<f32>,
    metrics: StepMetrics,
}

impl Accumulator {
    /// An empty accumulator for `model`'s trainable parameters.
    pub(crate) fn new<M: Module>(model: &M) -> Self {
        let layout = FlatLayout::new(param_infos(model).into_iter().filter(|p| p.trainable));
        let flat = vec![0.0; layout.len()];
        Self {
            layout,
            flat,
            metrics: StepMetrics::default(),
        }
    }

    /// Runs forward and backward of `objective` on `batch` on `working` (the model in
    /// `precision`) and adds its gradients, widened to f32 and weighted by
    /// [`MixedPrecision::gradient_weight`].
    pub(crate) fn add<M, O>(
        &mut self,
        working: &M,
        objective: &O,
        batch: O::Batch,
        precision: &MixedPrecision,
    ) where
        O: Objective,
        M: Forward<Input = O::Input, Output = O::Output>,
    {
        let samples = batch.samples();
        let (mut grads, loss, correct) =
            forward_backward_with(working, objective, batch, precision);
        working.visit(&mut GradWriter {
            grads: &mut grads,
            layout: &self.layout,
            flat: &mut self.flat,
            scale: precision.gradient_weight(samples),
            accumulate: true,
        });
        self.metrics.record(loss, correct, samples);
    }

    /// The mean gradient over every sample added, by `rule`, for `model`'s parameters (no
    /// gradients when the rule skips the step).
    pub(crate) fn finish<M: Module>(
        mut self,
        model: &M,
        rule: &mut MeanGradient,
    ) -> Result<StepOutput, TrainError> {
        let total = self.metrics.samples() as f32;
        let apply = rule.finish(&mut self.flat[..], total, Ok)?;
        let grads = if apply {
            grads_from_flat(model, &self.layout, &self.flat)
        } else {
            // No gradients: the optimizer leaves parameters and its state untouched.
            GradientsParams::new()
        };
        Ok(self.metrics.output(grads))
    }
}
