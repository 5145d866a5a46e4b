//! Core vocabulary shared by every kiln crate.
//!
//! - [`segment`] — a model seen as an ordered list of segments, on which backward/communication
//!   overlap and pipeline stages build (and the planned planner will).
//! - [`backward_from`](mod@backward_from) — backward from an intermediate tensor given its
//!   gradient (how each segment's backward starts), without passes over the tensor.
//! - [`forward`] — [`Forward`], what the training steps need of any model (an input, an
//!   output); every [`ImageClassifier`] ([`classifier`]) is one.
//! - [`device_spec`] — parse device names such as `cpu:1` or `cuda:0` into Burn devices.
//! - [`gpu_runtime`] — the GPU runtime's per-process settings: the on-disk kernel and autotune
//!   cache, the autotune level, a per-kernel profile; [`gpu_options`] — the same as a
//!   program's options (clap arguments with the `clap` feature).
//! - [`flat`] — gradients and parameters in and out of flat buffers, for collectives.
//! - [`seed`] — deterministic, race-free seeding and initialisation ([`init_module`]).
//! - [`panic`](mod@panic) — the message of a thread's panic, for the error that reports it.
//! - [`warm_pool`] — keep a compute pool's threads polling for work between a step's parallel
//!   regions instead of sleeping.
//! - [`freed_memory`] — keep freed memory in the process, so steps stop faulting pages in.
//! - [`memory`] — count the bytes alive on the CPU: the process's, and per piece of work.
//! - [`params`] — small helpers to enumerate a module's parameters.
//! - [`sync_norm`] — batch norm with statistics over every data-parallel replica.
#![warn(missing_docs)]

pub mod backward_from;
pub mod classifier;
pub mod cpu_name;
pub mod device_spec;
pub mod flat;
pub mod forward;
pub mod freed_memory;
pub mod gpu_options;
pub mod gpu_runtime;
pub mod memory;
pub mod panic;
pub mod params;
pub mod seed;
mod seed_extension;
pub mod segment;
pub mod sync_norm;
pub mod warm_pool;

pub use backward_from::backward_from;
pub use classifier::ImageClassifier;
pub use cpu_name::cpu_name;
pub use device_spec::{CUDA_FIX, DeviceSpec, DeviceSpecError, WGPU_FIX};
pub use flat::{
    FlatEntry, FlatLayout, GradWriter, ParamReader, ParamWriter, fingerprint, fingerprint_values,
    grads_from_flat, read_params, write_params,
};
pub use forward::Forward;
pub use freed_memory::{FreedMemoryError, retain_freed_memory};
pub use memory::{AccountId, Charging, MemoryAccount, TrackingAllocator};
pub use panic::panic_message;
pub use params::{ParamInfo, param_infos, segment_param_infos};
pub use seed::{init_module, init_on_host, with_seed};
pub use segment::{Activation, SegmentId, Segmented, forward_segments};
pub use sync_norm::{
    StatsReducer, StatsTape, sync_batch_norm, sync_batch_norm_active, update_running_statistics,
};
pub use warm_pool::install_warm;
