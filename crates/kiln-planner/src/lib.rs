//! The planner's search, on costs it is given (profiling the model on the devices comes
//! next): [`balance_stages`] cuts a model's segments into contiguous pipeline stages, one per
//! device, minimising the slowest stage under each device's memory limit, with stage times
//! scaled by the speed of the device that runs them.
#![warn(missing_docs)]

mod partition;
#[cfg(test)]
mod partition_tests;

pub use partition::{DeviceCapacity, PlanError, SegmentCost, StagePlan, balance_stages};
