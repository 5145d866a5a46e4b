//! Training a [`Segmented`](kiln_core::Segmented) model as a pipeline of stages, each in its
//! own thread on its own device entry, following a [`Schedule`](crate::schedule::Schedule).

mod checkpoint;
mod config;
mod driver;
mod empty;
mod error;
mod evaluate;
mod mailbox;
mod stage;
mod train;
mod worker;

pub use config::PipelineConfig;
pub use error::PipelineError;
pub use train::{Pipeline, PipelineReport, StageReport};

#[cfg(test)]
mod precision_tests;
#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod tests;
