//! Why a checkpoint could not be written or read.

use std::path::PathBuf;

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file or directory could not be written, read or renamed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file of the checkpoint is not what its manifest says (truncated, corrupted,
    /// missing) or cannot be decoded.
    #[error("{}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The checkpoint belongs to another run: another model or other options that change
    /// the arithmetic.
    #[error("the checkpoint {} does not match this run: {differences}", path.display())]
    Mismatch {
        /// The checkpoint.
        path: PathBuf,
        /// Each difference, named.
        differences: String,
    },
    /// A fresh run was pointed at a store that holds another run's checkpoints.
    #[error("{} already holds checkpoints of a run (latest: {}): resume that run from its latest checkpoint, or save this one elsewhere", dir.display(), latest.display())]
    Occupied {
        /// The store's directory.
        dir: PathBuf,
        /// Its newest checkpoint.
        latest: PathBuf,
    },
    /// The run's checkpoint options cannot be honoured together (or one is out of range).
    #[error("{reason}")]
    Options {
        /// Which options, and why.
        reason: String,
    },
    /// There is nothing to resume from where a checkpoint was named.
    #[error("no checkpoint at {}", path.display())]
    Missing {
        /// Where one was looked for.
        path: PathBuf,
    },
}

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}
