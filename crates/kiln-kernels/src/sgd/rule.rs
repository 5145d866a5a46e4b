//! SGD's update rule, one element at a time, exactly as Burn's `Sgd` composes it from tensor
//! operations (weight decay, then momentum, then the step), so that kiln's one-pass kernel
//! and Burn's optimizer agree bit for bit.

use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;

/// SGD's coefficients, rounded to f32 as Burn's scalar operations round them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdCoefficients {
    /// The learning rate.
    pub lr: f32,
    /// The L2 penalty added to the gradient (`grad + penalty · param`), if any.
    pub weight_decay: Option<f32>,
    /// Momentum, if any.
    pub momentum: Option<MomentumCoefficients>,
}

/// Momentum's coefficients: `v ← (1 − dampening) · g + momentum · v`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MomentumCoefficients {
    /// The velocity's decay.
    pub momentum: f32,
    /// `1 − dampening`, the gradient's weight in the velocity.
    pub gradient_scale: f32,
    /// Nesterov's variant: the step is `momentum · v + g` instead of `v`.
    pub nesterov: bool,
}

impl SgdCoefficients {
    /// The gradient after weight decay (Burn's `param · penalty + grad`).
    #[inline(always)]
    fn decayed(&self, param: f32, grad: f32) -> f32 {
        match self.weight_decay {
            Some(penalty) => param * penalty + grad,
            None => grad,
        }
    }

    /// One element's step, velocity first: `(new param, new velocity)`; `velocity` is `None`
    /// on momentum's first step (the velocity starts as the gradient).
    #[inline(always)]
    pub(crate) fn element(&self, param: f32, grad: f32, velocity: Option<f32>) -> (f32, f32) {
        let grad = self.decayed(param, grad);
        let (step, velocity) = match self.momentum {
            None => (grad, 0.0),
            Some(m) => {
                let velocity = match velocity {
                    Some(v) => grad * m.gradient_scale + v * m.momentum,
                    None => grad,
                };
                let step = if m.nesterov {
                    velocity * m.momentum + grad
                } else {
                    velocity
                };
                (step, velocity)
            }
        };
        (param - step * self.lr, velocity)
    }
}

impl SgdCoefficients {
    /// The coefficients Burn's `Sgd` applies at learning rate `lr` under its weight-decay and
    /// momentum configurations, rounded as Burn rounds them (momentum to f32 first;
    /// `1 − dampening` computed in f64, then rounded).
    ///
    /// ```
    /// use burn::optim::momentum::MomentumConfig;
    /// use kiln_kernels::SgdCoefficients;
    ///
    /// let c = SgdCoefficients::from_burn(0.1, None, Some(&MomentumConfig::new()));
    /// assert_eq!(c.lr, 0.1f32);
    /// let m = c.momentum.unwrap();
    /// assert_eq!((m.momentum, m.gradient_scale, m.nesterov), (0.9, 0.9, false));
    /// ```
    pub fn from_burn(
        lr: f64,
        weight_decay: Option<&WeightDecayConfig>,
        momentum: Option<&MomentumConfig>,
    ) -> Self {
        Self {
            lr: lr as f32,
            weight_decay: weight_decay.map(|w| w.penalty),
            momentum: momentum.map(|m| MomentumCoefficients {
                momentum: m.momentum as f32,
                gradient_scale: (1.0 - m.dampening) as f32,
                nesterov: m.nesterov,
            }),
        }
    }
}
