//! Data for kiln: datasets, transforms, a distributed sampler and a prefetching loader.
//!
//! - [`ImageSource`]: random access to labelled images; any Burn
//!   [`Dataset`](burn::data::dataset::Dataset) of [`ImageItem`] plugs in through
//!   [`BurnDataset`].
//! - Datasets: [`Cifar10`] (binary format), [`Mnist`] (IDX, plain or gzip) and the seeded,
//!   learnable [`SyntheticImages`].
//! - [`Transform`]s run in the workers with a random generator derived from
//!   (seed, epoch, sample index), so augmentation does not depend on the worker count.
//! - [`DistributedSampler`]: PyTorch's semantics (equal share per rank, padding or
//!   `drop_last`, `set_epoch` reshuffles) plus weighted shares for uneven devices.
//! - [`DataLoader`]: persistent worker threads, bounded prefetch queues, batches built as
//!   tensors on the target device, the same batch sequence for any number of workers;
//!   [`LoaderOptions`]: its `--workers` and `--prefetch` as a program's options (clap
//!   arguments with the `clap` feature).
//! - [`ImageTask`]: a classification run's training and validation images with their
//!   transforms (CIFAR-10 augmented, or a synthetic CIFAR-shaped task), making loaders.
//! - [`Batch`] and [`BatchSource`]: what training needs of any batch type and of whatever
//!   yields batches (the loader, [`BatchList`], a user's own), so a user's own model trains
//!   on the user's own batches.
//!
//! ```
//! use burn::tensor::Device;
//! use kiln_data::{DataLoader, SyntheticImages};
//!
//! let data = SyntheticImages::cifar_like(64, 10, 7);
//! let mut loader = DataLoader::builder(data)
//!     .batch_size(16)
//!     .num_workers(2)
//!     .shuffle(42)
//!     .device(Device::flex())
//!     .build();
//! let mut batches = 0;
//! for batch in loader.epoch(0) {
//!     let batch = batch.unwrap();
//!     assert_eq!(batch.images.dims(), [16, 3, 32, 32]);
//!     batches += 1;
//! }
//! assert_eq!(batches, 4);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod batch;
mod datasets;
mod error;
mod loader;
mod rng;
mod sampler;
mod samples;
mod source;
mod task;
mod text;
mod transform;

pub use batch::{ImageBatch, ImageItem};
pub use datasets::{Cifar10, Mnist, SyntheticImages};
pub use error::DataError;
pub use loader::{DataLoader, DataLoaderBuilder, EpochIter, LoaderOptions, worker_count};
pub use sampler::{DistributedSampler, proportional_split};
pub use samples::{Batch, BatchList, BatchSource, Batches, cut_batch};
pub use source::{BurnDataset, ImageSource};
pub use task::ImageTask;
pub use text::{TextCorpus, TextWindows, TextWindowsBuilder, TokenBatch};
pub use transform::Transform;
