//! # kiln
//!
//! A pure-Rust deep-learning training framework on [Burn](https://burn.dev) with parallelism
//! built in. This facade re-exports kiln's crates:
//!
//! - [`amp`] — automatic mixed precision: f16/bf16 compute, f32 master weights, loss scaling.
//! - [`core`] — model segments, device names, seeding.
//! - [`comm`] — collectives (all-reduce, broadcast, all-gather, reduce-scatter, send/recv)
//!   with timeouts instead of hangs.
//! - [`data`] — a prefetching multi-worker loader, a distributed sampler, CIFAR-10, MNIST and
//!   synthetic data.
//! - [`ddp`] — data-parallel training: replicas, bucketed all-reduce overlapped with backward.
//! - [`kernels`] — kiln's own CPU kernels (convolution on im2col + GEMM, batch norm on
//!   NCHW, each with its own backward), used by the ResNet family and usable in any Burn model.
//! - [`train`] — the trainer, learning-rate schedules and metrics.
//! - [`planner`] — profiles a model on the devices and picks data-parallel, pipeline or
//!   hybrid plans by predicted step time under memory limits.
//! - [`checkpoint`] — checkpoints written atomically with checksums, and exact resume.
//! - [`resnet`] — the ResNet family.
//! - [`gpt`] — a GPT-style transformer language model (tied head, segmented by block).
//! - [`doctor`] — what this build and machine can do (features, CPU, devices, CUDA, MPI),
//!   with a fix for each problem.
//!
//! See the README for a tour and `examples/resnet_ddp/` for a complete program.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use burn;

pub mod doctor;

pub use kiln_amp as amp;
pub use kiln_checkpoint as checkpoint;
pub use kiln_comm as comm;
pub use kiln_core as core;
pub use kiln_data as data;
pub use kiln_ddp as ddp;
pub use kiln_gpt as gpt;
pub use kiln_kernels as kernels;
pub use kiln_pipeline as pipeline;
pub use kiln_planner as planner;
pub use kiln_resnet as resnet;
pub use kiln_train as train;
