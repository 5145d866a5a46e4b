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
    /// Saving or resuming a checkpoint failed. The cause is the checkpoint store's own
    /// error where it has one (kiln-checkpoint's `CheckpointError`: reach it with
    /// `downcast_ref`), else why the run cannot resume.
    #[error("checkpoint: {0}")]
    Checkpoint(#[source] CheckpointCause),
    /// The device failed (a synchronisation after queued work).
    #[error("device: {0}")]
    Device(String),
    /// The run's log (metrics, curves) could not be written.
    #[error("run log: {0}")]
    Log(String),
}

/// The cause of [`TrainError::Checkpoint`]: kept whole, typed, for `downcast_ref`.
pub type CheckpointCause = Box<dyn std::error::Error + Send + Sync>;

impl TrainError {
    /// A checkpoint failure from the checkpoint store's error or from a message.
    pub fn checkpoint(cause: impl Into<CheckpointCause>) -> Self {
        Self::Checkpoint(cause.into())
    }
}

#[cfg(test)]
mod tests {
    use super::TrainError;

    /// The checkpoint store's error stays itself under `TrainError::Checkpoint`: a caller
    /// can tell a missing file from a corrupted one without parsing the message.
    #[test]
    fn a_checkpoint_error_keeps_its_cause_typed() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "model.bpk");
        let err = TrainError::checkpoint(missing);
        assert_eq!(err.to_string(), "checkpoint: model.bpk");
        let source = std::error::Error::source(&err).expect("the cause is the source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("still an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        let why = TrainError::checkpoint(format!("step {}", 4));
        assert_eq!(why.to_string(), "checkpoint: step 4");
    }
}
