//! Pipeline schedules as data.
//!
//! A [`Schedule`] lists, for each stage (device), the [`Action`]s it runs in one training
//! step: forwards and backwards of micro-batches through its model chunks, the sends and
//! receives between stages, and the gradient reduction and optimizer step at the end.
//! Generators ([`gpipe`], [`one_f_one_b`], [`interleaved_1f1b`]) decide the order of compute
//! and a lowering pass adds the communication it implies; [`Schedule::validate`] checks any
//! schedule, [`simulate`] dry-runs it with given [`Costs`] into a [`Timeline`] (step time,
//! bubble, activations held), and [`Schedule::chart`] draws that timeline.
//!
//! Plain data with no tensor or runtime dependency: kiln's planner predicts pipelines with
//! it, and kiln-pipeline's runtime follows the same schedules (re-exported there as
//! `kiln_pipeline::schedule`).
//!
//! ```
//! use kiln_schedule::{Costs, Schedule, ScheduleKind, simulate};
//!
//! // GPipe runs every forward before any backward: stage 0 holds all four micro-batches'
//! // activations, where 1F1B holds two.
//! let costs = Costs::uniform(1.0, 2.0);
//! let gpipe = Schedule::new(ScheduleKind::GPipe, 2, 4)?;
//! let one_f_one_b = Schedule::new(ScheduleKind::OneFOneB, 2, 4)?;
//! gpipe.validate()?;
//! assert_eq!(simulate(&gpipe, &costs)?.peak_in_flight(0), 4);
//! assert_eq!(simulate(&one_f_one_b, &costs)?.peak_in_flight(0), 2);
//! # Ok::<(), kiln_schedule::ScheduleError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod action;
mod base;
mod bubble;
mod chart;
mod error;
mod generate;
mod kind;
mod simulate;
mod validate;

#[cfg(test)]
mod generate_tests;
#[cfg(test)]
mod validate_tests;

pub use action::Action;
pub use base::Schedule;
pub use bubble::{bubble_formula, bubble_overhead};
pub use error::{BlockedAction, ScheduleError};
pub use generate::{gpipe, interleaved_1f1b, one_f_one_b};
pub use kind::ScheduleKind;
pub use simulate::{Costs, Span, Timeline, simulate};
