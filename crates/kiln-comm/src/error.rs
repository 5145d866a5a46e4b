//! Communication errors.

use std::time::Duration;

/// Why a collective or point-to-point operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// The operation did not complete within the group's timeout.
    #[error("rank {rank}: `{op}` timed out after {waited:?} waiting for its peers")]
    Timeout {
        /// The operation that waited.
        op: &'static str,
        /// The rank that gave up.
        rank: usize,
        /// How long it waited.
        waited: Duration,
    },
    /// Another rank failed, panicked or left; the group can no longer communicate.
    #[error("rank {rank}: `{op}` failed because rank {peer} is gone: {reason}")]
    PeerLost {
        /// The operation that failed.
        op: &'static str,
        /// The rank reporting the error.
        rank: usize,
        /// The rank that was lost.
        peer: usize,
        /// What happened to it.
        reason: String,
    },
    /// The ranks called the operation with incompatible arguments.
    #[error("rank {rank}: `{op}`: {detail}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// The rank reporting the error.
        rank: usize,
        /// What was wrong.
        detail: String,
    },
    /// The backend cannot do this (e.g. Burn's native collective on a CPU device).
    #[error("rank {rank}: `{op}` is not supported here: {detail}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The rank reporting the error.
        rank: usize,
        /// Why, and what to use instead.
        detail: String,
    },
    /// The backend could not start (e.g. MPI was already initialised in this process).
    #[error("communication start-up failed: {0}")]
    Startup(String),
}
