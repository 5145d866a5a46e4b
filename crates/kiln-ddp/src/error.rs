//! Data-parallel errors.

use kiln_train::TrainError;

/// Why a data-parallel run failed.
#[derive(Debug, thiserror::Error)]
pub enum DdpError {
    /// A replica returned an error (the root cause; other replicas' "peer lost" errors that
    /// followed from it are not reported).
    #[error("replica {rank}: {source}")]
    Replica {
        /// The failing replica.
        rank: usize,
        /// Its error.
        #[source]
        source: TrainError,
    },
    /// A replica panicked.
    #[error("replica {rank} panicked: {message}")]
    Panicked {
        /// The replica.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The run was configured inconsistently.
    #[error("invalid data-parallel configuration: {0}")]
    Config(String),
}
