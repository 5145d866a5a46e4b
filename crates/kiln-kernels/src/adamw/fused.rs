//! AdamW, Burn's `AdamW` arithmetic in one parallel pass per parameter.

use burn::backend::Dispatch;
use burn::config::Config;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::{
    AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, LearningRate, ModuleOptimizer, Optimizer,
};
use burn::tensor::{DType, Device, Tensor};

use super::extension::AdamWKernel;
use super::rule::AdamWCoefficients;
use crate::conv::entry::on_flex;

/// Configuration of [`FusedAdamW`]: the fields and defaults of Burn's `AdamWConfig`, so that
/// replacing one with the other changes a run's speed and nothing else.
///
/// ```
/// use kiln_kernels::FusedAdamWConfig;
///
/// let optimizer = FusedAdamWConfig::new().with_weight_decay(0.1).init();
/// # let _ = optimizer;
/// ```
#[derive(Config, Debug)]
pub struct FusedAdamWConfig {
    /// The first moment's decay.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// The second moment's decay.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the corrected second moment's square root.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// The decoupled weight decay (each step multiplies a parameter by `1 − lr · decay`).
    #[config(default = 1e-4)]
    pub weight_decay: f32,
    /// Cautious weight decay: decay only where the parameter's sign agrees with the update's.
    #[config(default = false)]
    pub cautious_weight_decay: bool,
    /// AMSGrad: divide by the largest second moment seen so far.
    #[config(default = false)]
    pub amsgrad: bool,
    /// Gradient clipping, applied by [`init`](Self::init)'s `ModuleOptimizer` before the step.
    pub grad_clipping: Option<GradientClippingConfig>,
}

impl FusedAdamWConfig {
    /// The bare optimizer (for `ModuleOptimizer::with_group`); [`init`](Self::init) is the
    /// whole-module one.
    pub fn build(&self) -> FusedAdamW {
        FusedAdamW {
            config: self.clone(),
        }
    }

    /// The optimizer for a whole module, with the configured gradient clipping: what
    /// `kiln_train::Trainer::builder` takes.
    pub fn init(&self) -> ModuleOptimizer {
        let mut optimizer = ModuleOptimizer::from(self.build());
        if let Some(clipping) = &self.grad_clipping {
            optimizer = optimizer.with_grad_clipping(clipping.init());
        }
        optimizer
    }

    /// Burn's `AdamWConfig` with the same settings (what other backends and dtypes run).
    pub fn burn(&self) -> AdamWConfig {
        AdamWConfig::new()
            .with_beta_1(self.beta_1)
            .with_beta_2(self.beta_2)
            .with_epsilon(self.epsilon)
            .with_weight_decay(self.weight_decay)
            .with_cautious_weight_decay(self.cautious_weight_decay)
            .with_amsgrad(self.amsgrad)
            .with_grad_clipping(self.grad_clipping.clone())
    }
}

/// AdamW with decoupled weight decay (optionally cautious) and AMSGrad: Burn's `AdamW` bit
/// for bit — for an f32 parameter on the CPU in one pass over the parameter, its gradient
/// and its moments, split over the replica's threads and in place, where Burn's `AdamW` runs
/// about fourteen single-threaded element-wise operations, each with a buffer of its own.
/// Other backends and dtypes run Burn's `AdamW`.
///
/// Its state is Burn's `AdamWState`: a record of either optimizer resumes under the other.
#[derive(Clone, Debug)]
pub struct FusedAdamW {
    /// Its settings (the gradient clipping is the `ModuleOptimizer`'s, not the step's).
    config: FusedAdamWConfig,
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let f32_flex = |t: &Tensor<D>| on_flex(t) && t.dtype() == DType::F32;
        let device = tensor.device();
        let fits = f32_flex(&tensor)
            && f32_flex(&grad)
            && grad.device() == device
            && state.as_ref().is_none_or(|s| {
                let m = &s.momentum;
                [
                    Some(&m.moment_1),
                    Some(&m.moment_2),
                    m.max_moment_2.as_ref(),
                ]
                .into_iter()
                .flatten()
                .all(|t| f32_flex(t) && t.device() == device)
            });
        let c = &self.config;
        if !fits {
            // The same step in Burn's operations (a struct of six numbers, built per call).
            return c.burn().build().step(lr, tensor, grad, state);
        }
        let time = state.as_ref().map_or(1, |s| s.momentum.time + 1);
        let coefficients = |amsgrad| {
            AdamWCoefficients::new(
                lr,
                c.beta_1,
                c.beta_2,
                c.epsilon,
                c.weight_decay,
                c.cautious_weight_decay,
                amsgrad,
                time,
            )
        };
        let (param, grad) = (tensor.into_dispatch(), grad.into_dispatch());
        let (param, moment_1, moment_2, max_moment_2) = match state.map(|s| s.momentum) {
            Some(AdaptiveMomentumState {
                moment_1,
                moment_2,
                max_moment_2: Some(max),
                ..
            }) if c.amsgrad => {
                let (p, m1, m2, max) = <Dispatch as AdamWKernel>::kiln_amsgrad_step(
                    param,
                    grad,
                    moment_1.into_dispatch(),
                    moment_2.into_dispatch(),
                    max.into_dispatch(),
                    coefficients(true),
                );
                (p, m1, m2, Some(Tensor::from_dispatch(max)))
            }
            Some(state) => {
                let (p, m1, m2) = <Dispatch as AdamWKernel>::kiln_adamw_step(
                    param,
                    grad,
                    state.moment_1.into_dispatch(),
                    state.moment_2.into_dispatch(),
                    coefficients(false),
                );
                // Without AMSGrad a recorded maximum is kept as it is (as Burn's `AdamW`
                // keeps it); AMSGrad without one starts it (below).
                (p, m1, m2, state.max_moment_2.filter(|_| !c.amsgrad))
            }
            None => {
                let (p, m1, m2) = <Dispatch as AdamWKernel>::kiln_adamw_first_step(
                    param,
                    grad,
                    coefficients(false),
                );
                (p, m1, m2, None)
            }
        };
        let moment_2 = Tensor::from_dispatch(moment_2);
        // AMSGrad's first maximum is the second moment itself (its step divided by it, as
        // the plain step does): Burn's `max_pair` of the moment with itself.
        let max_moment_2 = match max_moment_2 {
            None if c.amsgrad => Some(moment_2.clone()),
            max => max,
        };
        let momentum = AdaptiveMomentumState {
            time,
            moment_1: Tensor::from_dispatch(moment_1),
            moment_2,
            max_moment_2,
        };
        (
            Tensor::from_dispatch(param),
            Some(AdamWState::new(momentum)),
        )
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        <AdamW as Optimizer>::to_device(state, device)
    }
}
