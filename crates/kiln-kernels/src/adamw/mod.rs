//! AdamW's update: the per-element rule (moments, bias corrections, decoupled and cautious
//! weight decay, AMSGrad), its one-pass CPU kernel registered as a Burn backend extension,
//! and `FusedAdamW`, the optimizer that runs it.

mod extension;
mod flex;
mod fused;
mod rule;
#[cfg(test)]
mod tests;

pub use extension::AdamWKernel;
pub use fused::{FusedAdamW, FusedAdamWConfig};
pub use rule::{AdamWCoefficients, AdamWDecay};
