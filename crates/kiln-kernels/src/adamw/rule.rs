//! AdamW's update rule, one element at a time, exactly as Burn's `AdamW` composes it from
//! tensor operations (the moments, their bias corrections, the decoupled weight decay, then
//! the step), so that kiln's one-pass kernel and Burn's optimizer agree bit for bit.

/// How the parameter decays before the step (decoupled from the gradient, as AdamW does).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AdamWDecay {
    /// No decay (a rate `lr · weight_decay` of zero).
    None,
    /// `param · keep`, with `keep = 1 − lr · weight_decay` (rounded once, as Burn does).
    Scaled {
        /// The factor each parameter is multiplied by.
        keep: f32,
    },
    /// Cautious weight decay (arXiv 2510.12402): `param − rate · param`, but only where the
    /// parameter's sign agrees with the first moment's (both `≥ 0` or both `< 0`).
    Cautious {
        /// `lr · weight_decay`.
        rate: f32,
    },
}

/// One AdamW step's coefficients, rounded to f32 as Burn's scalar operations round them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWCoefficients {
    /// The learning rate.
    pub lr: f32,
    /// The first moment's decay.
    pub beta_1: f32,
    /// The second moment's decay.
    pub beta_2: f32,
    /// `1 − beta_1`, the gradient's weight in the first moment.
    pub factor_1: f32,
    /// `1 − beta_2`, the squared gradient's weight in the second moment.
    pub factor_2: f32,
    /// The first moment's bias correction at this step `t`: `1 − beta_1^t`.
    pub correction_1: f32,
    /// The second moment's: `1 − beta_2^t`.
    pub correction_2: f32,
    /// Added to the corrected second moment's square root.
    pub epsilon: f32,
    /// The decoupled weight decay.
    pub decay: AdamWDecay,
    /// AMSGrad: the step divides by the largest second moment seen so far.
    pub amsgrad: bool,
}

/// One element's state after a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Updated {
    pub param: f32,
    pub moment_1: f32,
    pub moment_2: f32,
    /// The running maximum of the second moment (AMSGrad's), else 0.
    pub max_moment_2: f32,
}

impl AdamWCoefficients {
    /// The coefficients of step `time` (1 for the first) at learning rate `lr`, rounded as
    /// Burn's `AdamW` rounds them: the factors and corrections computed in f32, the decay
    /// rate `lr · weight_decay` in f64, then rounded.
    ///
    /// ```
    /// use kiln_kernels::{AdamWCoefficients, AdamWDecay};
    ///
    /// let c = AdamWCoefficients::new(1e-3, 0.9, 0.999, 1e-5, 0.1, false, false, 1);
    /// assert_eq!(c.correction_1, 1.0 - 0.9f32);
    /// assert_eq!(c.decay, AdamWDecay::Scaled { keep: (1.0 - 1e-3 * 0.1f32 as f64) as f32 });
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lr: f64,
        beta_1: f32,
        beta_2: f32,
        epsilon: f32,
        weight_decay: f32,
        cautious_weight_decay: bool,
        amsgrad: bool,
        time: usize,
    ) -> Self {
        let time = i32::try_from(time).unwrap_or(i32::MAX);
        let rate = lr * weight_decay as f64;
        let decay = if rate == 0.0 {
            AdamWDecay::None
        } else if cautious_weight_decay {
            AdamWDecay::Cautious { rate: rate as f32 }
        } else {
            AdamWDecay::Scaled {
                keep: (1.0 - rate) as f32,
            }
        };
        Self {
            lr: lr as f32,
            beta_1,
            beta_2,
            factor_1: 1.0 - beta_1,
            factor_2: 1.0 - beta_2,
            correction_1: 1f32 - beta_1.powi(time),
            correction_2: 1f32 - beta_2.powi(time),
            epsilon,
            decay,
            amsgrad,
        }
    }

    /// The step's direction from the new first moment and the second moment it divides by:
    /// `m̂₁ / (√m̂₂ + ε)`, both corrected for their bias.
    #[inline(always)]
    pub(crate) fn delta(&self, moment_1: f32, second: f32) -> f32 {
        (moment_1 / self.correction_1) / ((second / self.correction_2).sqrt() + self.epsilon)
    }

    /// One element's step. `moments`: the previous step's first and second moments (`None`
    /// on the first step: they start from the gradient); `max_moment_2`: AMSGrad's running
    /// maximum (`None` when there is none yet: it starts as the second moment).
    #[inline(always)]
    pub(crate) fn element(
        &self,
        param: f32,
        grad: f32,
        moments: Option<(f32, f32)>,
        max_moment_2: Option<f32>,
    ) -> Updated {
        let (moment_1, moment_2) = match moments {
            Some((m1, m2)) => (
                m1 * self.beta_1 + grad * self.factor_1,
                m2 * self.beta_2 + (grad * grad) * self.factor_2,
            ),
            None => (grad * self.factor_1, (grad * grad) * self.factor_2),
        };
        // Burn's `max_pair`: the other value where this one is lower.
        let max_moment_2 = match (self.amsgrad, max_moment_2) {
            (false, _) => 0.0,
            (true, Some(max)) if max < moment_2 => moment_2,
            (true, Some(max)) => max,
            (true, None) => moment_2,
        };
        let second = if self.amsgrad { max_moment_2 } else { moment_2 };
        let delta = self.delta(moment_1, second);
        let decayed = match self.decay {
            AdamWDecay::None => param,
            AdamWDecay::Scaled { keep } => param * keep,
            // Burn masks the decay term to 0 where the signs differ: `param − 0`, which is
            // `param` for every value (signed zeros and NaN included).
            AdamWDecay::Cautious { .. } if (param >= 0.0) != (moment_1 >= 0.0) => param,
            AdamWDecay::Cautious { rate } => param - param * rate,
        };
        Updated {
            param: decayed - delta * self.lr,
            moment_1,
            moment_2,
            max_moment_2,
        }
    }
}
