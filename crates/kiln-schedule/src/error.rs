//! Why a schedule could not be built, validated or simulated.

use std::fmt;

use super::Action;

/// An action a stage was waiting at when a simulation could go no further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedAction {
    /// The stage (device).
    pub stage: usize,
    /// The action's position in the stage's list.
    pub index: usize,
    /// The action (always a receive).
    pub action: Action,
}

/// `stage 1 waits at action 0 (recv activation of micro-batch 0 from stage 0)`.
impl fmt::Display for BlockedAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stage {} waits at action {} ({})",
            self.stage, self.index, self.action
        )
    }
}

/// Why a schedule could not be built, validated or simulated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// The pipeline has no stages.
    #[error("a pipeline needs at least one stage (got 0)")]
    ZeroStages,
    /// The step has no micro-batches.
    #[error("a pipeline step needs at least one micro-batch (got 0)")]
    ZeroMicroBatches,
    /// Interleaving was asked for with fewer than two chunks per device.
    #[error(
        "interleaved 1F1B needs at least 2 virtual stages (model chunks) per device, got \
         {virtual_stages}; with one chunk per device use 1f1b"
    )]
    TooFewVirtualStages {
        /// The chunks per device asked for.
        virtual_stages: usize,
    },
    /// 1F1B was asked for with fewer micro-batches than stages.
    #[error(
        "1F1B needs at least as many micro-batches as stages (M={micro_batches}, \
         P={stages}): with fewer, stage 0 cannot fill the pipeline; use gpipe or raise \
         --micro-batches"
    )]
    TooFewMicroBatches {
        /// M.
        micro_batches: usize,
        /// P.
        stages: usize,
    },
    /// Interleaving was asked for with a number of micro-batches that is not a multiple of
    /// the number of stages.
    #[error(
        "interleaved 1F1B needs the micro-batches to be a multiple of the stages \
         (M={micro_batches}, P={stages}): micro-batches travel round the devices in groups \
         of P, each group through one chunk after another; use a multiple of {stages} for \
         --micro-batches"
    )]
    MicroBatchesNotMultipleOfStages {
        /// M.
        micro_batches: usize,
        /// P.
        stages: usize,
    },
    /// A schedule name that [`ScheduleKind`](super::ScheduleKind) does not know.
    #[error(
        "unknown schedule {input:?}: expected gpipe, 1f1b, interleaved or \
         interleaved:<chunks per device> (e.g. interleaved:3)"
    )]
    UnknownKind {
        /// What was given.
        input: String,
    },
    /// An action that breaks the schedule's rules where it stands.
    #[error("stage {stage}, action {index} ({action}): {problem}")]
    InvalidAction {
        /// The stage whose list holds it.
        stage: usize,
        /// Its position in that list.
        index: usize,
        /// The action.
        action: Action,
        /// What is wrong with it.
        problem: String,
    },
    /// An action the schedule needs that a stage never runs.
    #[error("stage {stage}: {action} never runs")]
    MissingAction {
        /// The stage that should run it.
        stage: usize,
        /// The action.
        action: Action,
    },
    /// No stage could make progress before all had finished: each unfinished stage waits for
    /// a message that no stage will send.
    #[error(
        "deadlock: no stage can make progress: {}",
        .blocked.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    Deadlock {
        /// Every unfinished stage, at the receive it waits on.
        blocked: Vec<BlockedAction>,
    },
    /// Costs that do not fit the schedule, or are negative or not finite.
    #[error("invalid costs: {0}")]
    InvalidCosts(String),
}
