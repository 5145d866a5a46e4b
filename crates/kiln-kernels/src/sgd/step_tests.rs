//! kiln's SGD kernel against Burn's own `Sgd` optimizer: bit for bit over several steps, for
//! every combination of weight decay, momentum and Nesterov, at any thread count, with shared
//! buffers and strided gradients.

use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{Optimizer, SgdConfig, SgdState};
use burn::tensor::{Device, Tensor};

use super::rule::SgdCoefficients;
use super::step::{burn_sgd_step, sgd_step};
use crate::test_support::{in_pool, values};

/// Elements per test tensor: several of the kernel's parallel pieces, and a ragged end.
const LEN: usize = 3 * (1 << 14) + 123;

fn tensor(seed: u64) -> Tensor<2> {
    Tensor::<1>::from_floats(values(LEN, seed).as_slice(), &Device::flex()).reshape([3, LEN / 3])
}

fn bits(t: &Tensor<2>) -> Vec<u32> {
    let values = t.to_data().try_to_vec::<f32>().unwrap();
    values.iter().map(|v| v.to_bits()).collect()
}

/// An optimizer configuration: weight decay and momentum (Burn's `SgdConfig` keeps its
/// fields private).
#[derive(Debug)]
struct Config {
    weight_decay: Option<WeightDecayConfig>,
    momentum: Option<MomentumConfig>,
}

impl Config {
    fn new() -> Self {
        Self {
            weight_decay: None,
            momentum: None,
        }
    }

    fn with_weight_decay(mut self, w: Option<WeightDecayConfig>) -> Self {
        self.weight_decay = w;
        self
    }

    fn with_momentum(mut self, m: Option<MomentumConfig>) -> Self {
        self.momentum = m;
        self
    }

    fn burn(&self) -> SgdConfig {
        SgdConfig::new()
            .with_weight_decay(self.weight_decay.clone())
            .with_momentum(self.momentum.clone())
    }
}

/// Every optimizer configuration the kernel distinguishes.
fn configs() -> Vec<Config> {
    let decay = || Some(WeightDecayConfig::new(5e-4));
    let momentum = |nesterov| {
        Some(
            MomentumConfig::new()
                .with_momentum(0.9)
                .with_dampening(0.1)
                .with_nesterov(nesterov),
        )
    };
    vec![
        Config::new(),
        Config::new().with_weight_decay(decay()),
        Config::new().with_momentum(momentum(false)),
        Config::new()
            .with_momentum(momentum(false))
            .with_weight_decay(decay()),
        Config::new()
            .with_momentum(momentum(true))
            .with_weight_decay(decay()),
    ]
}

fn coefficients(config: &Config, lr: f64) -> SgdCoefficients {
    SgdCoefficients::from_burn(lr, config.weight_decay.as_ref(), config.momentum.as_ref())
}

/// Three steps of Burn's `Sgd` and of `kiln` (a step function of kiln's shape) from the same
/// parameter and gradients, compared bit for bit after every step.
fn compare_with_burn(
    config: &Config,
    kiln: impl Fn(
        Tensor<2>,
        Tensor<2>,
        Option<Tensor<2>>,
        SgdCoefficients,
    ) -> (Tensor<2>, Option<Tensor<2>>),
) {
    let burn_sgd = config.burn().build();
    let (mut burn_param, mut burn_state): (Tensor<2>, Option<SgdState<2>>) = (tensor(1), None);
    let (mut param, mut velocity) = (tensor(1), None);
    for (step, lr) in [0.1, 0.05, 0.2].into_iter().enumerate() {
        let grad = tensor(10 + step as u64);
        (burn_param, burn_state) = burn_sgd.step(lr, burn_param, grad.clone(), burn_state);
        (param, velocity) = kiln(param, grad, velocity, coefficients(config, lr));
        assert_eq!(
            bits(&param),
            bits(&burn_param),
            "{config:?}: step {step} differs from Burn's Sgd"
        );
        assert_eq!(velocity.is_some(), config.momentum.is_some());
    }
}

#[test]
fn the_kernel_equals_burns_sgd_bit_for_bit() {
    for config in configs() {
        compare_with_burn(&config, sgd_step);
    }
}

#[test]
fn the_fallback_equals_burns_sgd_bit_for_bit() {
    for config in configs() {
        compare_with_burn(&config, burn_sgd_step);
    }
}

/// The control: the comparison above tells configurations apart (a dampening of 0.1 against
/// Burn's with none fails it).
#[test]
#[should_panic(expected = "differs from Burn's Sgd")]
fn a_different_dampening_fails_the_comparison() {
    let config = Config::new().with_momentum(Some(
        MomentumConfig::new().with_momentum(0.9).with_dampening(0.0),
    ));
    let other = Config::new().with_momentum(Some(
        MomentumConfig::new().with_momentum(0.9).with_dampening(0.1),
    ));
    compare_with_burn(&config, |p, g, v, c| {
        let _ = c;
        sgd_step(p, g, v, coefficients(&other, c.lr as f64))
    });
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let config = &configs()[4];
    let run = |threads| {
        in_pool(threads, || {
            let (mut param, mut velocity) = (tensor(1), None);
            for step in 0..3 {
                (param, velocity) = sgd_step(
                    param,
                    tensor(20 + step),
                    velocity,
                    coefficients(config, 0.1),
                );
            }
            (bits(&param), bits(&velocity.unwrap()))
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn shared_buffers_are_left_untouched_and_strided_gradients_are_read_right() {
    let config = &configs()[3];
    let c = coefficients(config, 0.1);
    let param = tensor(1);
    let kept_param = param.clone();
    let (param, velocity) = sgd_step(param, tensor(2), None, c);
    let velocity = velocity.unwrap();
    let kept_velocity = velocity.clone();
    // A gradient read through a transposed view.
    let strided = tensor(3).reshape([LEN / 3, 3]).transpose();
    let contiguous = Tensor::<2>::from_data(strided.to_data(), &Device::flex());
    let (got, got_velocity) = sgd_step(param.clone(), strided, Some(velocity.clone()), c);
    let (want, want_velocity) = burn_sgd_step(param, contiguous, Some(velocity), c);
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&got_velocity.unwrap()), bits(&want_velocity.unwrap()));
    assert_eq!(
        bits(&kept_param),
        bits(&tensor(1)),
        "the shared parameter changed"
    );
    let (_, v) = burn_sgd_step(tensor(1), tensor(2), None, c);
    assert_eq!(
        bits(&kept_velocity),
        bits(&v.unwrap()),
        "the shared velocity changed"
    );
}
