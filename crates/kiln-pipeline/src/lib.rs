//! Pipeline parallelism for kiln.
//!
//! A model too large for one device is cut into stages, one per device, and each training
//! step's batch into micro-batches that flow through the stages so that the devices work at
//! once. [`schedule`] holds what each stage does, and in which order, as plain data: a
//! [`Schedule`](schedule::Schedule) is generated (GPipe, 1F1B, interleaved 1F1B), validated,
//! and dry-run by [`simulate`](schedule::simulate) to time it and to find deadlocks before
//! anything runs; [`Schedule::chart`](schedule::Schedule::chart) draws the result (what
//! `--show-schedule` prints).
//!
//! [`Pipeline`] runs it: one thread per stage, the driver cutting each batch into
//! micro-batches. The model is any [`Segmented`](kiln_core::Segmented) one, whatever its
//! input and output; the last stage's loss is the [`Objective`](kiln_train::Objective)'s
//! (cross-entropy over image batches for [`Pipeline::new`], a user's own with
//! [`Pipeline::with_objective`]).
//!
//! ```
//! use kiln_pipeline::schedule::{bubble_formula, simulate, Costs, Schedule, ScheduleKind};
//!
//! // Two stages, four micro-batches; a backward takes twice as long as a forward.
//! let schedule = Schedule::new(ScheduleKind::OneFOneB, 2, 4)?;
//! let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0))?;
//! println!("{}", schedule.chart(&timeline));
//! // Each stage is idle (P − 1)/(M + P − 1) = 1/5 of the step.
//! assert!((timeline.bubble_fraction() - 0.2).abs() < 1e-9);
//! let formula = bubble_formula(ScheduleKind::OneFOneB, 2, 4)?;
//! assert!((timeline.bubble_fraction() - formula).abs() < 1e-9);
//! // Stage 0 holds the activations of at most two micro-batches at once.
//! assert_eq!(timeline.peak_in_flight(0), 2);
//! # Ok::<(), kiln_pipeline::schedule::ScheduleError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod options;
mod runtime;
mod shape;
/// Pipeline schedules as data: the [`kiln_schedule`] crate, which needs no runtime.
pub use kiln_schedule as schedule;

pub use options::PipelineOptions;
pub use runtime::{Pipeline, PipelineConfig, PipelineError, PipelineReport, StageReport};
pub use shape::PipelineShape;

// The unit tests count each stage's memory, as a binary that installs the allocator does.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: kiln_core::TrackingAllocator = kiln_core::TrackingAllocator;
