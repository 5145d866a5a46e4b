//! Where a run starts: a checkpoint's state, or a fresh run's, for any plan's replica.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use kiln_train::{StepState, TrainPosition};

use crate::{CheckpointError, RunIdentity, resume, resume_owning};

/// What a replica starts training with.
pub struct RunStart<M> {
    /// The checkpoint's model, or the fresh one given.
    pub model: M,
    /// The checkpoint's optimizer state (this replica's part of it under ZeRO-1), or the
    /// fresh optimizer given.
    pub optimizer: ModuleOptimizer,
    /// The step to start at: give it to the trainer's `resume_at`.
    pub position: TrainPosition,
    /// The gradient step's saved state (the loss scaler): give it to
    /// `GradientStep::restore_state` (`null` for a fresh run).
    pub step_state: StepState,
    /// The checkpoint it came from; `None` for a fresh run.
    pub resumed_from: Option<PathBuf>,
}

/// Starts from the checkpoint at `from` (checked against `identity`), or fresh with `model`
/// and `optimizer` as given when `from` is `None`. `owned` names the parameters whose
/// optimizer state this replica keeps (a ZeRO-1 shard, see [`resume_owning`]); `None`:
/// all of them.
///
/// # Errors
/// As [`resume`] and [`resume_owning`]: nothing is restored then.
pub fn start_from<M: Module>(
    from: Option<&Path>,
    identity: &RunIdentity,
    model: M,
    optimizer: ModuleOptimizer,
    owned: Option<&[String]>,
) -> Result<RunStart<M>, CheckpointError> {
    let Some(path) = from else {
        return Ok(RunStart {
            model,
            optimizer,
            position: TrainPosition::default(),
            step_state: StepState::Null,
            resumed_from: None,
        });
    };
    let resumed = match owned {
        Some(owned) => resume_owning(path, identity, model, optimizer, owned)?,
        None => resume(path, identity, model, optimizer)?,
    };
    Ok(RunStart {
        model: resumed.model,
        optimizer: resumed.optimizer,
        position: resumed.position,
        step_state: resumed.step_state,
        resumed_from: Some(resumed.path),
    })
}
