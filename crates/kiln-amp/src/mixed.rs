//! Mixed precision as a setting of a training step.

use burn::module::Module;
use burn::tensor::{FloatDType, Tensor};

use crate::{AmpPolicy, FloatCast, GradScaler, Precision, cast_module};

/// What a step does in mixed precision: the compute [`Precision`], which parameters stay
/// f32 ([`AmpPolicy`]) and the loss scaler ([`GradScaler`]).
///
/// A step holding one casts a working copy of the f32 master model once per step
/// ([`working_copy`](Self::working_copy)), feeds it inputs in the working precision
/// ([`input`](Self::input)), takes the loss in f32 ([`logits`](Self::logits)), backpropagates
/// `loss × scale` and unscales while widening the gradients to f32 (they arrive weighted by
/// [`gradient_weight`](Self::gradient_weight)). After the gradients of every replica are
/// reduced, [`update`](Self::update) tells it whether they were finite, which decides
/// whether the optimizer steps. [`MixedPrecision::f32`] is plain f32 training: no copy, no
/// casts, no scaling, and every step applies.
///
/// ```
/// use kiln_amp::{MixedPrecision, Precision};
///
/// let f16 = MixedPrecision::new(Precision::F16);
/// assert_eq!(f16.loss_scale(), 65536.0, "f16 scales the loss by default");
/// let bf16 = MixedPrecision::new(Precision::Bf16);
/// assert_eq!(bf16.loss_scale(), 1.0, "bf16 has f32's range: no scaler");
/// assert!(MixedPrecision::f32().is_f32());
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MixedPrecision {
    precision: Precision,
    policy: AmpPolicy,
    scaler: Option<GradScaler>,
}

impl MixedPrecision {
    /// Plain f32 training.
    pub fn f32() -> Self {
        Self::default()
    }

    /// Compute in `precision` with the default policy, and a [`GradScaler`] for f16 only.
    pub fn new(precision: Precision) -> Self {
        Self {
            precision,
            policy: AmpPolicy::default(),
            scaler: precision.needs_scaling().then(GradScaler::default),
        }
    }

    /// Uses `scaler` (e.g. restored from a checkpoint, or to scale bf16 too).
    pub fn with_scaler(mut self, scaler: GradScaler) -> Self {
        self.scaler = Some(scaler);
        self
    }

    /// Uses `policy` to decide which parameters stay f32.
    pub fn with_policy(mut self, policy: AmpPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The compute precision.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The policy.
    pub fn policy(&self) -> &AmpPolicy {
        &self.policy
    }

    /// The scaler, to save with a checkpoint.
    pub fn scaler(&self) -> Option<&GradScaler> {
        self.scaler.as_ref()
    }

    /// Whether this is plain f32 training without a scaler (nothing to cast or check).
    pub fn is_f32(&self) -> bool {
        self.precision == Precision::F32 && self.scaler.is_none()
    }

    /// The factor the loss is multiplied by before backward (1 without a scaler).
    pub fn loss_scale(&self) -> f32 {
        self.scaler.as_ref().map_or(1.0, GradScaler::scale)
    }

    /// The factor a micro-batch's gradients are added with: its sample count (the step
    /// divides the sum by the total, giving the exact mean over all samples) over the loss
    /// scale (undoing the scaling).
    pub fn gradient_weight(&self, samples: usize) -> f32 {
        samples as f32 / self.loss_scale()
    }

    /// The working copy of the master `model` for this step: trainable parameters cast to
    /// the precision (except those the policy keeps), parameter ids unchanged. `None` in f32,
    /// where the master itself is used.
    pub fn working_copy<M: Module>(&self, model: &M) -> Option<M> {
        (self.precision != Precision::F32)
            .then(|| cast_module(model.clone(), self.precision.dtype(), &self.policy))
    }

    /// `input` (a model's input: a tensor, or any [`FloatCast`] value) in the working
    /// precision.
    pub fn input<T: FloatCast>(&self, input: T) -> T {
        match self.precision {
            Precision::F32 => input,
            precision => input.cast_float(precision.dtype()),
        }
    }

    /// `logits` (a model's output: a tensor, or any [`FloatCast`] value) in f32, so
    /// softmax, cross-entropy and the loss run in f32.
    pub fn logits<T: FloatCast>(&self, logits: T) -> T {
        match self.precision {
            Precision::F32 => logits,
            _ => logits.cast_float(FloatDType::F32),
        }
    }

    /// `loss` multiplied by the loss scale, ready for backward.
    pub fn scaled_loss<const D: usize>(&self, loss: Tensor<D>) -> Tensor<D> {
        match self.scaler {
            Some(ref scaler) => loss.mul_scalar(scaler.scale()),
            None => loss,
        }
    }

    /// Records whether this step's reduced gradients held an inf or NaN, and says whether
    /// the optimizer may apply them: a non-finite step is skipped (and, with a scaler,
    /// halves the scale). Every replica must pass the same `found_non_finite` (agree on it
    /// first), so that they skip the same steps and their scalers stay identical.
    pub fn update(&mut self, found_non_finite: bool) -> bool {
        match &mut self.scaler {
            Some(scaler) => scaler.update(found_non_finite),
            None => !found_non_finite,
        }
    }
}

/// What a mixed-precision step has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AmpStats {
    /// Steps run.
    pub steps: usize,
    /// Steps skipped because a gradient was inf or NaN.
    pub skipped: usize,
    /// The loss scale now (1 without a scaler).
    pub scale: f32,
}
