//! Gradient accumulation over micro-batches.

use kiln_core::{FlatLayout, GradWriter, ImageClassifier, grads_from_flat, param_infos};
use kiln_data::ImageBatch;

use crate::{StepMetrics, StepOutput, forward_backward};

/// Sums sample-weighted gradients over micro-batches, so that the result is the mean
/// gradient over all their samples: exactly one large batch's gradient.
#[derive(Debug)]
pub struct Accumulator {
    layout: FlatLayout,
    flat: Vec<f32>,
    metrics: StepMetrics,
}

impl Accumulator {
    /// An empty accumulator for `model`'s trainable parameters.
    pub fn new<M: ImageClassifier>(model: &M) -> Self {
        let layout = FlatLayout::new(param_infos(model).into_iter().filter(|p| p.trainable));
        let flat = vec![0.0; layout.len()];
        Self {
            layout,
            flat,
            metrics: StepMetrics::default(),
        }
    }

    /// Runs forward and backward on `batch` and adds its gradients, weighted by its size.
    pub fn add<M: ImageClassifier>(&mut self, model: &M, batch: ImageBatch) {
        let samples = batch.indices.len();
        let (mut grads, loss, correct) = forward_backward(model, batch);
        model.visit(&mut GradWriter {
            grads: &mut grads,
            layout: &self.layout,
            flat: &mut self.flat,
            scale: samples as f32,
            accumulate: true,
        });
        self.metrics.record(loss, correct, samples);
    }

    /// Samples added so far.
    pub fn samples(&self) -> usize {
        self.metrics.samples()
    }

    /// The mean gradient over every sample added.
    pub fn finish<M: ImageClassifier>(self, model: &M) -> StepOutput {
        let scale = 1.0 / self.metrics.samples().max(1) as f32;
        let mut flat = self.flat;
        flat.iter_mut().for_each(|g| *g *= scale);
        self.metrics
            .output(grads_from_flat(model, &self.layout, &flat))
    }
}
