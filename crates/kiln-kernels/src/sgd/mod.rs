//! SGD's update: the per-element rule (weight decay, momentum, Nesterov), its one-pass CPU
//! kernel registered as a Burn backend extension, and `FusedSgd`, the optimizer that runs it.

mod extension;
mod flex;
mod fused;
#[cfg(test)]
mod fused_tests;
mod rule;
mod step;
#[cfg(test)]
mod step_tests;

pub use extension::SgdKernel;
pub use fused::{FusedSgd, FusedSgdConfig, FusedSgdState};
pub use rule::{MomentumCoefficients, SgdCoefficients};
pub use step::sgd_step;
