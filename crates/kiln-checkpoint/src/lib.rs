//! Checkpoints for kiln: a run saved every N steps and resumed exactly.
//!
//! - [`CheckpointStore`]: a directory of checkpoints, each written into a temporary
//!   directory, synced file by file with the manifest last, then renamed into place; the
//!   newest K kept; every file checked against its CRC-32 when read.
//! - [`Checkpointer`]: the trainer's [`CheckpointHook`](kiln_train::CheckpointHook): the
//!   model's weights in Burn's burnpack format (loadable in plain Burn), the optimizer's
//!   state, each parameter's id, and where the run stood.
//! - [`ResumeFrom`]: where a run starts (fresh, the latest whole checkpoint, a named one);
//!   [`Restarts`]: a failed attempt run again from the newest checkpoint that verifies.
//! - [`RunOptions`]: a run directory's options (`--run-dir`, `--checkpoint-every`, `--keep`,
//!   `--resume`, `--max-restarts`; a clap `Args` with the `clap` feature), checked together
//!   and turned into all of the above; [`Attempt`]: one attempt of the run (the first, or a
//!   restart), which every data-parallel replica's trainer and every pipeline wire in.
//! - [`Relaunch`]: a job (an `mpirun` command) run again after it fails; [`LaunchOptions`]:
//!   the same as a program's `launch` subcommand.
//! - [`resume`]: the model, optimizer and position back, after checking the files and that
//!   the checkpoint is of this run ([`RunIdentity`]: the model and the options that change
//!   the arithmetic); the trainer continues with the batches not yet seen.
//!
//! ```
//! use burn::nn::{Linear, LinearConfig};
//! use burn::module::Module;
//! use burn::optim::SgdConfig;
//! use burn::tensor::Device;
//! use kiln_checkpoint::{CheckpointStore, Checkpointer, RunIdentity, resume};
//! use kiln_train::TrainPosition;
//!
//! let dir = std::env::temp_dir().join(format!("kiln-doc-{}", std::process::id()));
//! let device = Device::flex().autodiff();
//! let model: Linear = LinearConfig::new(4, 2).init(&device);
//! let identity = RunIdentity::new("linear 4x2").with("lr", 0.1);
//! let saver = Checkpointer::new(CheckpointStore::new(&dir, 3), 100, identity.clone());
//! let position = TrainPosition { step: 7, epoch: 1, step_in_epoch: 2 };
//! let saved = saver.save_now(&position, &model, &SgdConfig::new().init())?;
//!
//! let fresh: Linear = LinearConfig::new(4, 2).init(&device);
//! let resumed = resume(&saved, &identity, fresh, SgdConfig::new().init())?;
//! assert_eq!(resumed.position, position);
//! assert_eq!(
//!     resumed.model.weight.val().into_data(),
//!     model.weight.val().into_data()
//! );
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), kiln_checkpoint::CheckpointError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attempt;
mod checkpointer;
#[cfg(test)]
mod elastic_tests;
mod error;
#[cfg(test)]
mod kill_tests;
mod launch_options;
mod manifest;
#[cfg(test)]
mod neutral_tests;
mod optimizer_parts;
mod parts;
#[cfg(test)]
mod parts_tests;
mod relaunch;
mod restart;
#[cfg(test)]
mod restart_tests;
mod run_options;
#[cfg(test)]
mod run_options_tests;
mod snapshot;
mod stage_part_files;
#[cfg(test)]
mod stage_part_tests;
mod stage_parts;
mod start;
mod store;
#[cfg(test)]
mod tests;

pub use attempt::Attempt;
pub use checkpointer::{
    Checkpointer, MODEL_FILE, OPTIMIZER_FILE, PARAM_IDS_FILE, Resumed, resume, resume_owning,
};
pub use error::CheckpointError;
pub use launch_options::LaunchOptions;
pub use manifest::{FORMAT, FileEntry, MANIFEST, Manifest, Position, RunIdentity};
pub use optimizer_parts::{join_optimizer_parts, optimizer_part_bytes, optimizer_part_name};
pub use parts::PartsToCollect;
pub use relaunch::{LAUNCH_VARIABLE, Relaunch, RelaunchError, RelaunchReport, launch_number};
pub use restart::{Restarts, ResumeFrom};
pub use run_options::RunOptions;
pub use snapshot::{
    assign_param_ids, model_bytes, optimizer_bytes, param_ids, restore_model, restore_optimizer,
};
pub use stage_part_files::stage_part_name;
pub use stage_parts::{StagePart, join_model_parts};
pub use start::{RunStart, start_from};
pub use store::{CheckpointStore, LatestWhole, LoadedCheckpoint};
