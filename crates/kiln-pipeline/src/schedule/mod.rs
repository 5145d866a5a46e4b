//! Pipeline schedules as data.
//!
//! A [`Schedule`] lists, for each stage (device), the [`Action`]s it runs in one training
//! step: forwards and backwards of micro-batches through its model chunks, the sends and
//! receives between stages, and the gradient reduction and optimizer step at the end.
//! Generators ([`gpipe`], [`one_f_one_b`], [`interleaved_1f1b`]) decide the order of compute
//! and a lowering pass adds the communication it implies; [`Schedule::validate`] checks any
//! schedule, [`simulate`] dry-runs it with given [`Costs`] into a [`Timeline`] (step time,
//! bubble, activations held), and [`Schedule::chart`] draws that timeline.

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
