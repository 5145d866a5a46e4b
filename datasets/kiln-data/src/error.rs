//! Data errors.

use std::path::PathBuf;

/// Why data could not be read or a batch could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The loader was configured with values it cannot use.
    #[error("invalid data loader configuration: {0}")]
    Config(String),
    /// A file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file's contents do not follow its format.
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the record where there is one.
        detail: String,
    },
    /// A sample could not be produced.
    #[error("sample {index}: {detail}")]
    Item {
        /// The sample's index in the data set.
        index: usize,
        /// What went wrong.
        detail: String,
    },
    /// A worker thread panicked while producing a sample.
    #[error("a loader worker panicked on sample {index}: {message}")]
    WorkerPanicked {
        /// The sample being produced.
        index: usize,
        /// The panic message.
        message: String,
    },
    /// A worker did not deliver its batch within the loader's timeout.
    #[error("loader worker {worker} did not deliver batch {batch} within {waited:?}")]
    Timeout {
        /// The worker.
        worker: usize,
        /// The batch it owed.
        batch: usize,
        /// How long the consumer waited.
        waited: std::time::Duration,
    },
    /// A worker thread stopped without delivering its batch.
    #[error("loader worker {worker} stopped before delivering batch {batch}")]
    WorkerLost {
        /// The worker.
        worker: usize,
        /// The batch it owed.
        batch: usize,
    },
    /// A batch has fewer samples than the micro-batches it was to be cut into.
    #[error("a batch of {samples} samples cannot be cut into {count} micro-batches")]
    Cut {
        /// Samples in the batch.
        samples: usize,
        /// Micro-batches asked for.
        count: usize,
    },
}
