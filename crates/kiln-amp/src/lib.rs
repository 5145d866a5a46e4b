//! Mixed-precision vocabulary for kiln: what to compute in, what stays f32, how to scale.
//!
//! PyTorch users know `autocast` + `GradScaler`; Burn 0.22 offers a per-tensor dtype and
//! explicit casts. In kiln, mixed precision is a setting of the training step, not a step of
//! its own: [`MixedPrecision`] is given to the one-device step
//! (`kiln_train::LocalStep::with_precision`) or to data-parallel training
//! (`kiln_ddp::DdpConfig::precision`), so every data-parallel option works under it.
//!
//! - **Master weights stay f32.** The model and the optimizer state are f32. Each step makes
//!   a working copy whose trainable parameters are cast to the [`Precision`] (same parameter
//!   ids), runs forward and backward on it, and hands f32 gradients to the optimizer, which
//!   updates the masters. The next step's copy is cast from the updated masters.
//! - **Policy** ([`AmpPolicy`]): parameters whose path matches a kept pattern stay f32
//!   (default: batch norm — `bn*` and `*norm*` — so its statistics and affine parameters are
//!   f32; the model must run such a layer on f32 input, as kiln's ResNet does). Logits are
//!   cast to f32 before softmax / cross-entropy, so the loss is f32.
//! - **Loss scaling** ([`GradScaler`]): f16 gradients are computed on `loss × scale`
//!   (initially 2^16), unscaled in f32, and checked: any inf/NaN skips the step and halves
//!   the scale; 2000 consecutive finite steps double it. bf16 (f32's exponent range) runs
//!   without a scaler by default. The scaler's state serialises with serde for checkpoints.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cast;
mod float_cast;
mod mixed;
mod policy;
mod precision;
mod scaler;

pub use cast::{cast_module, module_dtypes};
pub use float_cast::FloatCast;
pub use mixed::{AmpStats, MixedPrecision};
pub use policy::AmpPolicy;
pub use precision::{Precision, PrecisionParseError};
pub use scaler::{GradScaler, GradScalerConfig};

#[cfg(test)]
mod tests;
