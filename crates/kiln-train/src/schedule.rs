//! Learning-rate schedules.

/// What happens to the learning rate after warm-up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decay {
    /// Stays at the base rate.
    Constant,
    /// Cosine annealing from the base rate to `min_lr` at `total_steps`.
    Cosine {
        /// The step at which the rate reaches `min_lr`.
        total_steps: usize,
        /// The final rate.
        min_lr: f64,
    },
    /// Multiplied by `gamma` every `every` steps.
    Step {
        /// Steps between decays.
        every: usize,
        /// The factor.
        gamma: f64,
    },
}

/// The learning rate for a global batch of `global_batch` samples under the linear scaling
/// rule of Goyal et al. (2017), "Accurate, Large Minibatch SGD": `reference_lr` is the rate
/// for a batch of 256, scaled in proportion to the batch (pair it with a warm-up, which that
/// rule relies on for large batches).
///
/// ```
/// use kiln_train::linear_scaled_lr;
/// assert_eq!(linear_scaled_lr(0.1, 256), 0.1);
/// assert_eq!(linear_scaled_lr(0.1, 64), 0.025);
/// assert_eq!(linear_scaled_lr(0.1, 1024), 0.4);
/// ```
pub fn linear_scaled_lr(reference_lr: f64, global_batch: usize) -> f64 {
    reference_lr * global_batch as f64 / 256.0
}

/// How the learning rate follows the global batch (what a `--lr-scaling` option names).
///
/// ```
/// use kiln_train::LrScaling;
/// assert_eq!(LrScaling::Linear.lr(0.1, 512), 0.2);
/// assert_eq!(LrScaling::Linear.describe(0.1, 512), "lr 0.1 x 512/256 = 0.2 (linear scaling)");
/// assert_eq!(LrScaling::None.lr(0.1, 512), 0.1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum LrScaling {
    /// The rate as given.
    #[default]
    None,
    /// The rate is the one for a global batch of 256, scaled in proportion
    /// ([`linear_scaled_lr`]; Goyal et al.).
    Linear,
}

impl LrScaling {
    /// The peak rate for `global_batch` samples per optimizer step, from the given `lr`.
    pub fn lr(self, lr: f64, global_batch: usize) -> f64 {
        match self {
            LrScaling::None => lr,
            LrScaling::Linear => linear_scaled_lr(lr, global_batch),
        }
    }

    /// How the rate was reached, for a run's header.
    pub fn describe(self, lr: f64, global_batch: usize) -> String {
        match self {
            LrScaling::None => format!("lr {lr}"),
            LrScaling::Linear => format!(
                "lr {lr} x {global_batch}/256 = {} (linear scaling)",
                self.lr(lr, global_batch)
            ),
        }
    }
}

/// A learning rate as a pure function of the step: linear warm-up, then a [`Decay`].
///
/// Being a function of the step alone, every replica computes the same rate without
/// sharing state, and a resumed run continues exactly.
///
/// ```
/// use kiln_train::LrSchedule;
/// let schedule = LrSchedule::constant(0.1).warmup(10).cosine(110, 0.0);
/// assert!((schedule.lr(0) - 0.01).abs() < 1e-12);
/// assert!((schedule.lr(9) - 0.1).abs() < 1e-12);
/// assert!((schedule.lr(60) - 0.05).abs() < 1e-12);
/// assert!(schedule.lr(110).abs() < 1e-12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    base_lr: f64,
    warmup_steps: usize,
    decay: Decay,
}

impl LrSchedule {
    /// A constant rate.
    pub fn constant(base_lr: f64) -> Self {
        Self {
            base_lr,
            warmup_steps: 0,
            decay: Decay::Constant,
        }
    }

    /// Ramps linearly from `base_lr / steps` to `base_lr` over the first `steps` steps.
    pub fn warmup(mut self, steps: usize) -> Self {
        self.warmup_steps = steps;
        self
    }

    /// Cosine decay after warm-up, reaching `min_lr` at `total_steps`.
    pub fn cosine(mut self, total_steps: usize, min_lr: f64) -> Self {
        self.decay = Decay::Cosine {
            total_steps,
            min_lr,
        };
        self
    }

    /// Step decay after warm-up: ×`gamma` every `every` steps.
    pub fn step_decay(mut self, every: usize, gamma: f64) -> Self {
        self.decay = Decay::Step {
            every: every.max(1),
            gamma,
        };
        self
    }

    /// The base rate.
    pub fn base_lr(&self) -> f64 {
        self.base_lr
    }

    /// The rate at (0-based) `step`.
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let after = step - self.warmup_steps;
        match self.decay {
            Decay::Constant => self.base_lr,
            Decay::Cosine {
                total_steps,
                min_lr,
            } => {
                let span = total_steps.saturating_sub(self.warmup_steps).max(1);
                let progress = (after as f64 / span as f64).min(1.0);
                min_lr
                    + 0.5
                        * (self.base_lr - min_lr)
                        * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            Decay::Step { every, gamma } => self.base_lr * gamma.powi((after / every) as i32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_decay_multiplies_after_each_interval() {
        let s = LrSchedule::constant(1.0).warmup(2).step_decay(3, 0.5);
        let rates: Vec<f64> = (0..9).map(|i| s.lr(i)).collect();
        assert_eq!(rates, vec![0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]);
    }

    #[test]
    fn cosine_is_monotone_and_clamped_after_the_end() {
        let s = LrSchedule::constant(0.4).cosine(100, 0.01);
        let rates: Vec<f64> = (0..120).map(|i| s.lr(i)).collect();
        assert!(rates.windows(2).all(|w| w[1] <= w[0] + 1e-15));
        assert!((rates[119] - 0.01).abs() < 1e-12);
    }
}
