//! What the training loop asks of a plan: the step engine.

use kiln_data::{Batch, BatchSource, DataError};

use crate::{Evaluation, TrainError, TrainPosition};

/// What one optimizer step of an engine did, over every sample it trained on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineStep {
    /// Mean loss per sample.
    pub loss: f32,
    /// Samples the objective counted as right.
    pub correct: usize,
    /// Samples the step trained on.
    pub samples: usize,
    /// The loss scale the next step uses (mixed precision with a scaler).
    pub loss_scale: Option<f32>,
}

/// One plan's way of running optimizer steps under kiln's one training loop
/// ([`train_loop`](crate::train_loop)): a model replica with its
/// [`GradientStep`](crate::GradientStep) on one device or data parallel (what
/// [`Trainer::fit`](crate::Trainer::fit) runs), or the stages of a pipeline (kiln-pipeline's
/// engine). The loop owns what every plan shares — epochs, steps, the learning rate,
/// resume positions, stop agreement, checkpoint timing, validation timing, records,
/// observers, the progress bar and the summaries — and asks the engine only for what
/// differs between plans.
///
/// `B` is the batch type the engine trains on.
pub trait StepEngine<B: Batch> {
    /// The engine's error; what the loop finds (a bad configuration, a loader's error, a
    /// non-finite loss, an observer's error) becomes one too.
    type Error: From<TrainError> + From<DataError>;

    /// Loader batches one optimizer step takes (accumulated micro-batches, times the
    /// data-parallel pipelines that take a batch each).
    fn batches_per_step(&self) -> usize;

    /// Runs optimizer step `step` at learning rate `lr` on `batches` (exactly
    /// [`batches_per_step`](Self::batches_per_step) of them, in the loader's order).
    ///
    /// # Errors
    /// Whatever stops the engine: a failing replica or stage, a lost peer.
    fn step(&mut self, batches: Vec<B>, step: usize, lr: f64) -> Result<EngineStep, Self::Error>;

    /// Whether training stops after the step just run, given whether this process was
    /// asked to: every replica or process that must stay in step agrees (any one asked
    /// stops all), so they stop, and save, at the same step.
    ///
    /// # Errors
    /// A lost peer.
    fn agree_to_stop(&mut self, asked: bool) -> Result<bool, Self::Error>;

    /// Whether a checkpoint is due at `position` (after its last step); `last`: training
    /// ends there (done, or stopping). `false` for an engine without checkpoints.
    fn checkpoint_due(&self, position: &TrainPosition, last: bool) -> bool;

    /// Saves (or starts saving) the run at `position`.
    ///
    /// # Errors
    /// A failed save; the previous checkpoint stays intact.
    fn checkpoint(&mut self, position: &TrainPosition) -> Result<(), Self::Error>;

    /// Ends epoch `epoch`: makes one what replicas hold apart (batch-norm statistics), then
    /// evaluates `valid`'s batches (epoch 0 of it) when given.
    ///
    /// # Errors
    /// A loader's error, a failing replica or stage.
    fn end_epoch(
        &mut self,
        epoch: usize,
        valid: Option<&mut dyn BatchSource<Batch = B>>,
    ) -> Result<Option<Evaluation>, Self::Error>;

    /// Training is over: saves in the background complete here.
    ///
    /// # Errors
    /// A save that failed.
    fn finish(&mut self) -> Result<(), Self::Error>;
}
