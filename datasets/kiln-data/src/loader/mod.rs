//! The prefetching multi-worker loader.

mod builder;
mod collate;
mod epoch;
mod options;
mod worker;

pub use builder::DataLoaderBuilder;
pub use epoch::{DataLoader, EpochIter};
pub use options::{LoaderOptions, worker_count};

#[cfg(test)]
mod tests;
