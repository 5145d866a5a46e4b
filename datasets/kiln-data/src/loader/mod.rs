//! The prefetching multi-worker loader.

mod builder;
mod collate;
mod epoch;
mod worker;

pub use builder::DataLoaderBuilder;
pub use epoch::{DataLoader, EpochIter};

#[cfg(test)]
mod tests;
