//! The one rule every kiln step follows to turn micro-batch gradients into the optimizer's
//! gradient, whatever the precision and however many replicas.

use rayon::prelude::*;
use std::sync::{Arc, Mutex};

use kiln_amp::{AmpStats, MixedPrecision};
use kiln_comm::{CommError, ReduceOp};

use crate::TrainError;

/// What the finishing rule needs to know about a set of gradients: whether any value is inf
/// or NaN, and the sum of their squares (for the global norm).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GradientSummary {
    /// Whether some value is inf or NaN.
    pub non_finite: bool,
    /// The sum of the squares of every value (f64, so that large models do not overflow it).
    pub squared_norm: f64,
}

impl GradientSummary {
    /// The summary of `values`.
    pub fn of(values: &[f32]) -> Self {
        let mut summary = Self::default();
        for value in values {
            summary.non_finite |= !value.is_finite();
            summary.squared_norm += f64::from(*value) * f64::from(*value);
        }
        summary
    }

    /// The summary of the union of two disjoint sets (e.g. two ZeRO shards).
    pub fn combine(self, other: Self) -> Self {
        Self {
            non_finite: self.non_finite || other.non_finite,
            squared_norm: self.squared_norm + other.squared_norm,
        }
    }

    /// The summary of the union of the disjoint parts the ranks of a group hold (ZeRO shards,
    /// pipeline stages): overflow anywhere, squared norms added, through `all_reduce` (every
    /// rank calls it alike). The values travel as f32: when a squared norm, or their sum,
    /// leaves f32's range while every value is finite, a second round adds the squares
    /// relative to the largest part's norm instead, so a large norm still clips rather than
    /// reading as an overflow.
    ///
    /// # Errors
    /// What `all_reduce` returns.
    pub fn sum_over_ranks(
        self,
        mut all_reduce: impl FnMut(Vec<f32>, ReduceOp) -> Result<Vec<f32>, CommError>,
    ) -> Result<Self, TrainError> {
        let wide = self.squared_norm.is_finite() && (self.squared_norm as f32).is_infinite();
        let flag = |b: bool| f32::from(u8::from(b));
        let values = vec![flag(self.non_finite), self.squared_norm as f32, flag(wide)];
        let summed = all_reduce(values, ReduceOp::Sum)?;
        let non_finite = summed[0] > 0.0;
        if summed[2] == 0.0 && (summed[1].is_finite() || non_finite) {
            return Ok(Self {
                non_finite: non_finite || !summed[1].is_finite(),
                squared_norm: f64::from(summed[1]),
            });
        }
        let norm = self.squared_norm.sqrt();
        let largest = f64::from(all_reduce(vec![norm as f32], ReduceOp::Max)?[0]);
        let relative = if largest > 0.0 && largest.is_finite() {
            (norm / largest).powi(2)
        } else {
            0.0
        };
        let sum = f64::from(all_reduce(vec![relative as f32], ReduceOp::Sum)?[0]);
        Ok(Self {
            non_finite: non_finite || !largest.is_finite(),
            squared_norm: largest * largest * sum,
        })
    }
}

/// Gradients a step holds before the optimizer sees them: a host buffer (`[f32]`) or, in
/// the data-parallel step, buckets on a device.
pub trait GradientValues {
    /// Multiplies every value by `factor`.
    fn scale(&mut self, factor: f32);
    /// Whether any value is non-finite, and the sum of squares.
    fn summary(&self) -> GradientSummary;
}

impl GradientValues for [f32] {
    /// In pieces over the caller's rayon pool (a replica's whole gradient, once per step);
    /// each element's product is the same whichever thread computes it.
    fn scale(&mut self, factor: f32) {
        self.par_chunks_mut(1 << 14)
            .for_each(|piece| piece.iter_mut().for_each(|g| *g *= factor));
    }

    fn summary(&self) -> GradientSummary {
        GradientSummary::of(self)
    }
}

/// The mean gradient over every sample of a step, in any precision.
///
/// A step adds each micro-batch's gradients weighted by
/// [`MixedPrecision::gradient_weight`] (its sample count over the loss scale), sums them
/// over replicas if it has any, and calls [`finish`](Self::finish) with the total sample
/// count. `finish` divides (so the result is exactly the mean over all samples of all
/// micro-batches of all replicas, whatever their sizes), then, when there is anything to
/// check — a working precision other than f32, a loss scaler, or clipping — it has the
/// replicas agree on the gradients' summary, skips the step if a value is inf or NaN
/// (updating the loss scaler), and clips by the global norm:
/// `g × max_norm / (‖g‖ + 1e-6)` when `‖g‖ > max_norm`, PyTorch's `clip_grad_norm_`. The norm
/// is over every parameter of the model, over all replicas' reduced gradients (and over all
/// ZeRO shards, through the `agree` closure).
#[derive(Debug)]
pub struct MeanGradient {
    precision: MixedPrecision,
    max_norm: Option<f32>,
    stats: Arc<Mutex<AmpStats>>,
}

impl Default for MeanGradient {
    fn default() -> Self {
        Self::new(MixedPrecision::f32())
    }
}

impl MeanGradient {
    /// The rule for `precision`, without clipping.
    pub fn new(precision: MixedPrecision) -> Self {
        let stats = AmpStats {
            scale: precision.loss_scale(),
            ..AmpStats::default()
        };
        Self {
            precision,
            max_norm: None,
            stats: Arc::new(Mutex::new(stats)),
        }
    }

    /// The same rule in `precision` instead.
    pub fn with_precision(mut self, precision: MixedPrecision) -> Self {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).scale = precision.loss_scale();
        self.precision = precision;
        self
    }

    /// Clips gradients to a global norm of at most `max_norm`.
    ///
    /// # Errors
    /// [`TrainError::Config`] unless `max_norm` is positive and finite.
    pub fn with_max_norm(mut self, max_norm: f32) -> Result<Self, TrainError> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(TrainError::Config(format!(
                "the maximum gradient norm must be positive and finite, not {max_norm}"
            )));
        }
        self.max_norm = Some(max_norm);
        Ok(self)
    }

    /// The precision (its scaler holds the current loss scale).
    pub fn precision(&self) -> &MixedPrecision {
        &self.precision
    }

    /// The current loss scale (mixed precision with a scaler), `None` without one.
    pub fn loss_scale(&self) -> Option<f32> {
        self.precision.scaler().map(|scaler| scaler.scale())
    }

    /// What a checkpoint keeps of it: the loss scaler (`null` without one).
    pub fn saved_state(&self) -> crate::StepState {
        serde_json::json!({ "scaler": self.precision.scaler() })
    }

    /// Continues with the state [`saved_state`](Self::saved_state) gave (`null`: none).
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] for state of another kind, or a scaler where this
    /// precision has none (or none where it has one).
    pub fn restore_state(&mut self, state: &crate::StepState) -> Result<(), TrainError> {
        if state.is_null() {
            return Ok(());
        }
        let scaler: Option<kiln_amp::GradScaler> = state
            .get("scaler")
            .map(|s| serde_json::from_value(s.clone()))
            .transpose()
            .map_err(|err| TrainError::checkpoint(format!("the step's state: {err}")))?
            .flatten();
        match (scaler, self.precision.scaler().is_some()) {
            (Some(scaler), true) => {
                let precision = std::mem::replace(&mut self.precision, MixedPrecision::f32());
                self.precision = precision.with_scaler(scaler);
                Ok(())
            }
            (None, false) => Ok(()),
            (saved, _) => Err(TrainError::checkpoint(format!(
                "the checkpoint {} a loss scaler, this run's precision ({}) {}",
                if saved.is_some() { "has" } else { "has no" },
                self.precision.precision(),
                if saved.is_some() {
                    "has none"
                } else {
                    "needs one"
                }
            ))),
        }
    }

    /// The clipping norm, if any.
    pub fn max_norm(&self) -> Option<f32> {
        self.max_norm
    }

    /// A handle on the skipped-step statistics, readable after training.
    pub fn stats(&self) -> Arc<Mutex<AmpStats>> {
        Arc::clone(&self.stats)
    }

    /// Whether [`finish`](Self::finish) inspects the gradients (and calls `agree`); plain f32
    /// training without clipping does not.
    pub fn checks(&self) -> bool {
        !self.precision.is_f32() || self.max_norm.is_some()
    }

    /// Finishes the summed gradients `grads` of `total_samples` samples (see the type's
    /// docs); `agree` turns this replica's summary into the one every replica uses (the
    /// identity when every replica holds the same reduced gradients). Returns whether the
    /// optimizer should apply them.
    ///
    /// # Errors
    /// What `agree` returns.
    pub fn finish<G: GradientValues + ?Sized>(
        &mut self,
        grads: &mut G,
        total_samples: f32,
        agree: impl FnOnce(GradientSummary) -> Result<GradientSummary, TrainError>,
    ) -> Result<bool, TrainError> {
        grads.scale(1.0 / total_samples.max(1.0));
        let apply = if self.checks() {
            let summary = agree(grads.summary())?;
            let apply = self.precision.update(summary.non_finite);
            if let (true, Some(max_norm)) = (apply, self.max_norm) {
                let norm = summary.squared_norm.sqrt();
                if norm > f64::from(max_norm) {
                    grads.scale((f64::from(max_norm) / (norm + 1e-6)) as f32);
                }
            }
            apply
        } else {
            true
        };
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.steps += 1;
        stats.skipped += usize::from(!apply);
        stats.scale = self.precision.loss_scale();
        Ok(apply)
    }
}
