//! What this build and this machine can do, checked before a training run (and on a GPU node
//! without a Rust toolchain, since a binary carries it): the compiled features, the CPU, every
//! device it can open, CUDA's libraries, wgpu adapters, MPI, an all-reduce bandwidth per
//! available transport, and for each problem its fix. [`Task`]: the doctor, the
//! data-parallel self-test and the job launcher as any program's subcommands.
//!
//! ```
//! let checkup = kiln::doctor::Doctor::new("cpu:0").check();
//! print!("{checkup}");
//! assert!(checkup.passed());
//! ```

mod check;
mod comm;
mod gpu;
mod machine;
mod report;
mod task;
#[cfg(test)]
mod tests;

pub use check::{Checkup, Doctor};
pub use report::{Row, Status};
pub use task::Task;
