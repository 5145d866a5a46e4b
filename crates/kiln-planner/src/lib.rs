//! kiln's planner: it profiles a model's segments on the devices, predicts the step time and
//! memory of data-parallel, pipelined and hybrid plans, and picks the fastest that fits.
//!
//! - [`profile_segments`] measures each segment's forward and backward time, parameter bytes,
//!   output bytes and (where the device's memory can be read: an accelerator's allocator, or
//!   the CPU heap through [`TrackingAllocator`]) the activations it keeps for backward.
//!   [`profile_segments_with`] and [`profile_update_with`] profile any segmented model for
//!   its own objective (its batches, its loss).
//!   A [`ModelProfile`] holds profiles at several batch sizes and predicts any other size;
//!   [`ProfileCache`] keeps them as JSON.
//! - [`predict_data_parallel`] and [`predict_pipeline`] are the cost model; [`choose_plan`]
//!   searches the data-parallel × pipeline factorisations of the devices and micro-batch
//!   counts ([`choose_plan_with_lever`]: with Burn's gradient checkpointing where nothing
//!   fits without it); [`balance_stages`] cuts segments into stages by dynamic programming.
//! - A [`Plan`] prints as a table ([`Plan::table`]) and round-trips through JSON.
//!
//! Stage balancing on its own:
//!
//! ```
//! use kiln_planner::{DeviceCapacity, SegmentCost, balance_stages};
//!
//! // Six equal segments on a fast device and one twice as slow.
//! let segment = SegmentCost { seconds: 1.0, state_bytes: 10, activation_bytes: 5, output_bytes: 8 };
//! let fast = DeviceCapacity { slowdown: 1.0, memory: None, in_flight: 2 };
//! let slow = DeviceCapacity { slowdown: 2.0, memory: None, in_flight: 1 };
//! let plan = balance_stages(&[segment; 6], &[fast, slow], 0.0)?;
//! assert_eq!(plan.stages, vec![0..4, 4..6]);
//! assert_eq!(plan.bottleneck(), 4.0);
//! # Ok::<(), kiln_planner::PlanError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cache_choice;
mod cost;
mod interconnect;
#[cfg(test)]
mod lever_tests;
mod memory;
mod memory_limits;
mod model_profile;
mod options;
mod partition;
#[cfg(test)]
mod partition_tests;
mod plan;
mod planning;
mod planning_cache;
#[cfg(test)]
mod planning_cache_tests;
mod profile;
mod profile_model;
#[cfg(test)]
mod profile_tests;
mod search;
#[cfg(test)]
mod search_tests;
mod update_profile;

pub use cache_choice::ProfileCacheChoice;
pub use cost::{
    Interconnect, PipelineShape, PlanDevice, Workload, predict_data_parallel, predict_pipeline,
};
pub use interconnect::measure_interconnect;
pub use memory::TrackingAllocator;
pub use memory_limits::parse_memory_limits;
pub use model_profile::{ModelProfile, ProfileCache, ProfileKey, SegmentAt};
pub use options::PlanOptions;
pub use partition::{
    DeviceCapacity, PlanError, SegmentCost, StagePlan, balance_stages, human_bytes,
};
pub use plan::{Layout, Plan, Predicted, prediction_line};
pub use planning::{Planned, RunPlanning, device_kind};
pub use profile::{
    BatchProfile, ProfileError, ProfileOptions, SegmentProfile, profile_segments,
    profile_segments_with, segment_name,
};
pub use profile_model::profile_model;
pub use search::{
    DATA_PARALLEL_MARGIN, Fixed, PlanChoice, PlanRequest, TIE_MARGIN, choose_plan,
    choose_plan_with_lever,
};
pub use update_profile::{profile_update, profile_update_with};
