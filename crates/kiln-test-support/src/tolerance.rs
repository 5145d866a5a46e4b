//! Tolerances on [`change_error`](crate::change_error), from strictest to loosest. Each
//! names the arithmetic it allows to differ; the test that uses one states what it measured
//! and runs a control that must miss it.

/// The same gradients added in the same order, in any precision (a pipeline against one
/// device accumulating the same micro-batches; a checkpoint resumed under another plan):
/// bit for bit on the development machines. The margin is for CPUs whose kernels split a
/// sum differently.
pub const SAME_ORDER: f32 = 1e-5;

/// f32 sums taken in another order (data-parallel replicas against one device on the union
/// batch; clipping's norm summed per stage): measured 4.5e-7 to 4.4e-6. A 0.01 % error in
/// the learning rate measures 2.3e-4.
pub const REORDERED: f32 = 5e-5;

/// f32 on another kind of device's kernels (a stage on wgpu beside one on the CPU), or a
/// clipped step whose norm is summed in another order: measured up to 4.0e-4 (2 × 2 stages
/// on Flex + Mesa's lavapipe; a batch-norm scale moves least); a 1 % error in the learning
/// rate measures 0.91.
pub const OTHER_KERNELS: f32 = 2e-3;

/// f32 on a GPU whose matrix and convolution tiles compute in TF32 (Burn's accelerated
/// kernels promote f32 so), reduced in another order: the example's `selftest` on CUDA
/// (measured on CPUs ≤ 5e-6; the unsynchronised control misses by > 0.1).
pub const TF32: f32 = 1e-3;

/// Gradients compressed to f16/bf16 on the wire: measured 1.1e-3 and 7.1e-3.
pub const COMPRESSED: f32 = 2e-2;

/// Half-precision compute (bf16/f16) whose parts are rounded per replica or per device
/// instead of once over the whole batch: measured 4.3e-3 to 2.3e-2; the unsynchronised
/// controls measure 0.65 and more.
pub const HALF_PRECISION: f32 = 5e-2;

/// f16 computed partly by another kind of device's kernels (a stage on wgpu beside one on
/// the CPU), after one step: measured 0.105 on Mesa's lavapipe, where the f32 control
/// measures 0.46 (f16 training of a tiny model drifts apart from any other rounding within
/// a few steps).
pub const HALF_OTHER_KERNELS: f32 = 0.2;
