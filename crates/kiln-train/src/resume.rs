//! Where a run stands, and the hook that saves it: what checkpointing needs of the trainer.

use burn::optim::ModuleOptimizer;

use crate::TrainError;

/// Where a run stands between optimizer steps: a resumed run starts here and continues
/// exactly (the learning rate is a function of `step`, the loader's batches of the epoch
/// and the batch index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrainPosition {
    /// Optimizer steps done.
    pub step: usize,
    /// The epoch the next step belongs to.
    pub epoch: usize,
    /// Optimizer steps of that epoch already done.
    pub step_in_epoch: usize,
}

/// Saves the run now and then; the trainer calls it after optimizer steps (see
/// [`TrainerBuilder::checkpoint`](crate::TrainerBuilder::checkpoint)). With several
/// replicas every one has a hook (they decide alike), since a checkpoint first runs the
/// gradient step's `before_eval` on every replica (data parallelism averages batch-norm
/// statistics there); one of them writes.
pub trait CheckpointHook<M>: Send {
    /// Whether to save at `position` (after its last step). `finished`: training has just
    /// done its last step.
    fn should_save(&self, position: &TrainPosition, finished: bool) -> bool;

    /// Saves the model, the optimizer's state, the gradient step's state (the loss scaler)
    /// and the position.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] when the save fails; training stops with it, the previous
    /// checkpoint intact.
    fn save(
        &mut self,
        position: &TrainPosition,
        model: &M,
        optimizer: &ModuleOptimizer,
        step_state: &crate::StepState,
    ) -> Result<(), TrainError>;

    /// Called when training ends: a hook that saves in the background completes its last
    /// save here.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] if a save failed.
    fn finish(&mut self) -> Result<(), TrainError> {
        Ok(())
    }
}
