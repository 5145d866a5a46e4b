//! Why a pipeline run stopped.

use std::time::Duration;

use kiln_train::{CheckpointCause, TrainError};

use crate::schedule::ScheduleError;

/// Why a pipeline run stopped. Every stage stops in bounded time: a failed stage's peers
/// see it gone (or time out) and report [`PipelineError::PeerLost`]; the run reports the
/// root cause.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The configuration cannot run (the message says why).
    #[error("invalid pipeline configuration: {0}")]
    Config(String),
    /// The schedule cannot be built for this shape.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A batch could not be loaded.
    #[error("data: {0}")]
    Data(#[from] kiln_data::DataError),
    /// A stage failed (its own error, or a panic).
    #[error("stage {stage} failed: {message}")]
    Stage {
        /// The stage.
        stage: usize,
        /// What happened.
        message: String,
    },
    /// A stage waited longer than the timeout for a message.
    #[error("stage {stage} waited {waited:?} for {what}: a peer is stuck or gone")]
    Timeout {
        /// The waiting stage.
        stage: usize,
        /// What it waited for.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// A stage's peer stopped (because it failed).
    #[error("stage {stage} lost its peers while waiting for {what}")]
    PeerLost {
        /// The waiting stage.
        stage: usize,
        /// What it waited for.
        what: String,
    },
    /// A value could not move from one stage's device to the next's.
    #[error("moving {what} from stage {from}'s device to stage {to}'s failed: {why}")]
    Transfer {
        /// The sending stage.
        from: usize,
        /// The receiving stage.
        to: usize,
        /// What was moving.
        what: String,
        /// Why it failed.
        why: String,
    },
    /// A checkpoint could not be written, or the run could not resume from one: the
    /// checkpoint store's own error where it has one (`downcast_ref` to kiln-checkpoint's
    /// `CheckpointError`), else why.
    #[error("checkpoint: {0}")]
    Checkpoint(#[source] CheckpointCause),
    /// The data-parallel copies of a stage hold different parameters.
    #[error(
        "stage {stage}'s data-parallel copies diverged by step {step}: their parameters differ"
    )]
    Diverged {
        /// The stage.
        stage: usize,
        /// The step after which they were compared.
        step: usize,
    },
    /// The stages' copies of a tied parameter (`Segmented::tied_segments`, split across
    /// stages) hold different values.
    #[error("the stages' copies of a tied parameter diverged by step {step}: their values differ")]
    TiedDiverged {
        /// The step after which they were compared.
        step: usize,
    },
    /// The run's observer (its log) failed.
    #[error("the run's log: {0}")]
    Observer(String),
    /// The loss is NaN or infinite.
    #[error("the loss is not finite at step {step} ({loss})")]
    NonFiniteLoss {
        /// The step.
        step: usize,
        /// The loss.
        loss: f32,
    },
}

impl PipelineError {
    /// A checkpoint failure from the checkpoint store's error or from a message.
    pub fn checkpoint(cause: impl Into<CheckpointCause>) -> Self {
        Self::Checkpoint(cause.into())
    }
}

/// What the training loop finds (`kiln_train::train_loop`), as the pipeline's error.
impl From<TrainError> for PipelineError {
    fn from(err: TrainError) -> Self {
        match err {
            TrainError::Config(why) => PipelineError::Config(why),
            TrainError::Data(err) => PipelineError::Data(err),
            TrainError::NonFiniteLoss { step, loss } => PipelineError::NonFiniteLoss { step, loss },
            TrainError::Checkpoint(why) => PipelineError::Checkpoint(why),
            TrainError::Comm(err) => PipelineError::PeerLost {
                stage: 0,
                what: err.to_string(),
            },
            // An observer's (the run's log).
            other => PipelineError::Observer(other.to_string()),
        }
    }
}

impl PipelineError {
    /// Whether this error only reports another stage's failure.
    pub(crate) fn is_consequence(&self) -> bool {
        matches!(self, PipelineError::PeerLost { .. })
    }
}
