//! SGD with weight decay and momentum, Burn's `Sgd` arithmetic in one parallel pass per
//! parameter.

use super::{SgdCoefficients, sgd_step};
use burn::config::Config;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    LearningRate, ModuleOptimizer, Optimizer, RecordState, StateSink, StateSource, join_path,
};
use burn::tensor::{Device, Tensor};

/// Configuration of [`FusedSgd`]: the fields and defaults of Burn's `SgdConfig`, so that
/// replacing one with the other changes a run's speed and nothing else.
///
/// ```
/// use burn::optim::momentum::MomentumConfig;
/// use burn::optim::decay::WeightDecayConfig;
/// use kiln_kernels::FusedSgdConfig;
///
/// let optimizer = FusedSgdConfig::new()
///     .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
///     .with_weight_decay(Some(WeightDecayConfig::new(5e-4)))
///     .init();
/// # let _ = optimizer;
/// ```
#[derive(Config, Debug)]
pub struct FusedSgdConfig {
    /// Weight decay (an L2 penalty added to the gradient).
    pub weight_decay: Option<WeightDecayConfig>,
    /// Momentum (Burn's: `v = (1 − dampening) · g + momentum · v`, dampening 0.1 unless set).
    pub momentum: Option<MomentumConfig>,
    /// Gradient clipping, applied by [`init`](Self::init)'s `ModuleOptimizer` before the step.
    pub gradient_clipping: Option<GradientClippingConfig>,
}

impl FusedSgdConfig {
    /// The bare optimizer (for `ModuleOptimizer::with_group`); [`init`](Self::init) is the
    /// whole-module one.
    pub fn build(&self) -> FusedSgd {
        FusedSgd {
            weight_decay: self.weight_decay.clone(),
            momentum: self.momentum.clone(),
        }
    }

    /// The optimizer for a whole module, with the configured gradient clipping: what
    /// `kiln_train::Trainer::builder` takes.
    pub fn init(&self) -> ModuleOptimizer {
        let mut optimizer = ModuleOptimizer::from(self.build());
        if let Some(clipping) = &self.gradient_clipping {
            optimizer = optimizer.with_grad_clipping(clipping.init());
        }
        optimizer
    }
}

/// Stochastic gradient descent with optional weight decay, momentum and Nesterov momentum:
/// Burn's `Sgd` bit for bit, run by [`sgd_step`] — on the CPU one pass over each
/// parameter, its gradient and its velocity, split over the replica's threads and in place,
/// where Burn's `Sgd` runs up to seven single-threaded element-wise operations, each with a
/// buffer of its own (a ResNet-18 w64 step spent about 7 % of its busiest thread there).
/// Other backends run Burn's operations.
///
/// Its state (a velocity per parameter under momentum) is recorded under the names Burn's
/// `Sgd` uses (`momentum.velocity`).
#[derive(Clone, Debug)]
pub struct FusedSgd {
    weight_decay: Option<WeightDecayConfig>,
    momentum: Option<MomentumConfig>,
}

/// [`FusedSgd`]'s state for one parameter: its velocity under momentum.
#[derive(Clone, Debug)]
pub struct FusedSgdState<const D: usize> {
    /// The velocity after the last step (`None` without momentum).
    pub velocity: Option<Tensor<D>>,
}

/// Where Burn's `SgdState` records the velocity: a nested momentum state.
const MOMENTUM: &str = "momentum";
const VELOCITY: &str = "velocity";

impl<const D: usize> RecordState for FusedSgdState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        if let Some(velocity) = &self.velocity {
            out.push_tensor(
                &join_path(prefix, MOMENTUM),
                VELOCITY,
                velocity.clone().into_data(),
            );
        }
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        let momentum = join_path(prefix, MOMENTUM);
        let velocity = if src.has_under(&momentum) {
            Some(Tensor::from_data(
                src.take_tensor(&momentum, VELOCITY)?,
                device,
            ))
        } else {
            None
        };
        Some(Self { velocity })
    }
}

impl Optimizer for FusedSgd {
    type State<const D: usize> = FusedSgdState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let coefficients =
            SgdCoefficients::from_burn(lr, self.weight_decay.as_ref(), self.momentum.as_ref());
        // A velocity recorded without momentum (a changed configuration) is not used.
        let velocity = state
            .and_then(|s| s.velocity)
            .filter(|_| self.momentum.is_some());
        let (tensor, velocity) = sgd_step(tensor, grad, velocity, coefficients);
        (tensor, Some(FusedSgdState { velocity }))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &Device) -> Self::State<D> {
        state.velocity = state.velocity.map(|v| v.to_device(device));
        state
    }
}
