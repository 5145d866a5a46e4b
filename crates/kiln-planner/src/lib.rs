//! The planner's search, on costs it is given (profiling the model on the devices comes
//! next): [`balance_stages`] cuts a model's segments into contiguous pipeline stages, one per
//! device, minimising the slowest stage under each device's memory limit, with stage times
//! scaled by the speed of the device that runs them.
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
#![warn(missing_docs)]

mod partition;
#[cfg(test)]
mod partition_tests;

pub use partition::{DeviceCapacity, PlanError, SegmentCost, StagePlan, balance_stages};
