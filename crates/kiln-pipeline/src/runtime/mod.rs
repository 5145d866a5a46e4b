//! Training a [`Segmented`](kiln_core::Segmented) model as a pipeline of stages, each in its
//! own thread on its own device entry, following a [`Schedule`](crate::schedule::Schedule).

mod checkpoint;
mod config;
mod empty;
mod engine;
mod error;
mod evaluate;
mod groups;
mod launch;
mod layout;
mod mailbox;
mod overlap;
mod pipeline;
#[cfg(feature = "mpi")]
mod processes;
mod report;
mod report_lines;
mod stage;
mod stage_gradient;
mod stage_start;
mod stage_step;
mod tied;
mod train;
mod transfer;
#[cfg(any(feature = "mpi", test))]
mod wire;
mod worker;

pub use config::PipelineConfig;
pub use error::PipelineError;
pub use pipeline::Pipeline;
pub use report::{PipelineReport, StageReport};

#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod gpt_tests;
#[cfg(test)]
mod objective_tests;
#[cfg(test)]
mod options_tests;
#[cfg(test)]
mod precision_tests;
#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transfer_tests;
