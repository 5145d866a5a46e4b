//! Data-parallel training for kiln.
//!
//! [`DataParallel::run`] starts one replica per device (threads of this process; several
//! replicas may share a device, which is how CPU runs and tests work) and hands each a
//! [`Replica`]: its rank, device and communication thread. The replica builds its model,
//! makes it identical to rank 0's with [`Replica::broadcast_module`], and trains with the
//! ordinary [`Trainer`](kiln_train::Trainer) using a [`DdpStep`] as its gradient step:
//!
//! - **Buckets.** Gradients are packed into buckets (default cap 25 MiB, a 1 MiB first bucket)
//!   in the order backward produces them, and all-reduced on the communication thread.
//! - **Overlap.** With [`Replica::overlapped_step`] (models implementing
//!   [`Segmented`](kiln_core::Segmented)), backward runs segment by segment and each bucket is
//!   reduced as soon as its segments are done, while earlier segments still differentiate.
//!   [`SyncStats`] reports how much communication was hidden.
//! - **Exact large-batch semantics.** Gradients are weighted by each replica's sample count,
//!   so N replicas (even with uneven batch sizes) update exactly like one replica on the
//!   union of their batches; gradient accumulation syncs once per optimizer step.
//!   [`Replica::split_batch`] sizes each replica's batch by its measured throughput.
//! - **Mixed precision** ([`DdpConfig::precision`]): f16/bf16 compute on a working copy,
//!   f32 master weights and f32 gradient reduction, loss scaling with a skip decision every
//!   replica shares. Every option here works under it.
//! - **Gradient clipping** by the global norm over all replicas and ZeRO shards
//!   ([`DdpConfig::max_grad_norm`]).
//! - **Compression** to f16/bf16 on the wire ([`Compression`]), **local SGD**
//!   ([`SyncMode::LocalSgd`]), batch-norm running statistics averaged over replicas after
//!   every synchronous step (so a checkpoint or an evaluation changes nothing), and a
//!   **divergence check** that names the first parameter that differs.
//! - **Device gradients** ([`GradientPath`]): on accelerators, gradients stay on the device
//!   and buckets are reduced by Burn's native all-reduce (NCCL) when every replica has its
//!   own CUDA device, else staged through the host once per bucket.
//! - **Synchronised batch norm** ([`DdpConfig::sync_batch_norm`]): layers normalised with
//!   [`kiln_core::sync_batch_norm`] use the statistics of all replicas' batches, with an
//!   exact backward, so N replicas train like one device even with batch norm.
//! - **ZeRO-1** ([`DdpConfig::zero1`]): optimizer state sharded over replicas; gradients are
//!   reduce-scattered and parameters all-gathered.
//! - **A thread pool per replica** ([`DdpConfig::threads_per_replica`]): each replica's
//!   CPU kernels run on its own share of the cores instead of contending in one global pool.
//! - **Any model, any loss**: the steps above train for kiln-train's
//!   [`Classification`](kiln_train::Classification) objective; their `_with` forms
//!   ([`Replica::overlapped_step_with`], [`Replica::non_overlapped_step_with`]) train any
//!   [`Forward`](kiln_core::Forward) / [`Segmented`](kiln_core::Segmented) model for any
//!   [`Objective`](kiln_train::Objective) (its batches, its loss), every option included.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod balance;
mod bucketing;
mod config;
mod consensus;
mod error;
mod grads;
mod options;
mod outcome;
mod pass;
mod plan;
mod reduce;
mod runtime;
mod selftest;
mod stats;
mod step;
mod threads;
mod zero;

pub use balance::BatchSplit;
pub use config::{Compression, DdpConfig, GradientPath, SyncMode};
pub use consensus::average_buffers;
pub use error::DdpError;
pub use options::DdpOptions;
pub use outcome::{ReplicaOutcome, StepWatch, outcome_lines, steady_step_seconds};
pub use plan::BucketPlan;
pub use runtime::{DataParallel, Replica};
pub use selftest::{SelfTest, SelfTestCheck, SelfTestReport};
pub use stats::SyncStats;
pub use step::DdpStep;
pub use threads::default_threads_per_replica;

#[cfg(test)]
mod compare;
#[cfg(test)]
mod device_tests;
#[cfg(test)]
mod gpt_tests;
#[cfg(test)]
mod objective_tests;
#[cfg(test)]
mod precision_tests;
#[cfg(test)]
mod start_tests;
#[cfg(test)]
mod sync_bn_tests;
#[cfg(test)]
mod sync_mode_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
