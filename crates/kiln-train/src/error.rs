//! Training errors.

/// Why training stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The builder was given an inconsistent configuration.
    #[error("invalid trainer configuration: {0}")]
    Config(String),
    /// A batch could not be loaded.
    #[error("data: {0}")]
    Data(#[from] kiln_data::DataError),
    /// The loss became NaN or infinite.
    #[error("the loss is not finite at step {step} ({loss})")]
    NonFiniteLoss {
        /// The global step.
        step: usize,
        /// The loss value.
        loss: f32,
    },
    /// A collective failed (data-parallel training): a peer was lost or timed out.
    #[error("communication: {0}")]
    Comm(#[from] kiln_comm::CommError),
    /// Replicas that must hold identical parameters do not.
    #[error("replicas diverged: {0}")]
    Diverged(String),
    /// Saving or resuming a checkpoint failed.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The run's log (metrics, curves) could not be written.
    #[error("run log: {0}")]
    Log(String),
}
