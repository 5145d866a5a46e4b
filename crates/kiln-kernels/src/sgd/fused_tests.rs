//! `FusedSgd` through Burn's `ModuleOptimizer` against Burn's `Sgd`: equal parameters bit for
//! bit after several steps, a record that resumes the run exactly, and records exchangeable
//! with Burn's `Sgd`.

use burn::nn::{Linear, LinearConfig};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Distribution, Tensor};

use super::FusedSgdConfig;

fn device() -> Device {
    Device::flex().autodiff()
}

fn model() -> Linear {
    kiln_core::init_module(&device(), 7, || LinearConfig::new(48, 40).init(&device()))
}

/// `optimizer`'s steps `from..to` of `model` (each step's input seeded by its index).
fn steps(
    mut model: Linear,
    optimizer: &mut ModuleOptimizer,
    range: std::ops::Range<u64>,
) -> Linear {
    for step in range {
        let x = kiln_core::init_module(&device(), step, || {
            Tensor::<2>::random([16, 48], Distribution::Default, &device())
        });
        let loss = model.forward(x).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(0.05, model, grads);
    }
    model
}

/// Every parameter's bits.
fn bits(model: &Linear) -> Vec<u32> {
    let weight = model.weight.val().into_data().try_to_vec::<f32>().unwrap();
    let bias = model.bias.as_ref().unwrap().val().into_data();
    let bias = bias.try_to_vec::<f32>().unwrap();
    weight.iter().chain(&bias).map(|v| v.to_bits()).collect()
}

fn momentum(dampening: f64, nesterov: bool) -> Option<MomentumConfig> {
    Some(
        MomentumConfig::new()
            .with_momentum(0.9)
            .with_dampening(dampening)
            .with_nesterov(nesterov),
    )
}

fn decay() -> Option<WeightDecayConfig> {
    Some(WeightDecayConfig::new(1e-2))
}

#[test]
fn fused_sgd_trains_exactly_like_burns_sgd() {
    for (m, w) in [
        (None, None),
        (momentum(0.1, false), decay()),
        (momentum(0.0, true), decay()),
    ] {
        let mut burn = SgdConfig::new()
            .with_momentum(m.clone())
            .with_weight_decay(w.clone())
            .init();
        let mut fused = FusedSgdConfig::new()
            .with_momentum(m.clone())
            .with_weight_decay(w.clone())
            .init();
        let start = bits(&model());
        let want = steps(model(), &mut burn, 0..4);
        let got = steps(model(), &mut fused, 0..4);
        assert_ne!(bits(&want), start, "the steps changed nothing");
        assert_eq!(bits(&got), bits(&want), "momentum {m:?}, decay {w:?}");
    }
}

/// The control: another dampening than Burn's is told apart.
#[test]
fn another_dampening_trains_differently() {
    let mut burn = SgdConfig::new().with_momentum(momentum(0.1, false)).init();
    let mut fused = FusedSgdConfig::new()
        .with_momentum(momentum(0.0, false))
        .init();
    let want = steps(model(), &mut burn, 0..3);
    let got = steps(model(), &mut fused, 0..3);
    assert_ne!(bits(&got), bits(&want));
}

#[test]
fn a_record_resumes_the_run_exactly_and_is_exchangeable_with_burns() {
    let fused = || {
        FusedSgdConfig::new()
            .with_momentum(momentum(0.1, false))
            .with_weight_decay(decay())
            .init()
    };
    let burn = || {
        SgdConfig::new()
            .with_momentum(momentum(0.1, false))
            .with_weight_decay(decay())
            .init()
    };
    let uninterrupted = steps(model(), &mut fused(), 0..4);
    // Two steps, the optimizer saved and loaded into a fresh one, two more.
    let mut first = fused();
    let halfway = steps(model(), &mut first, 0..2);
    let bytes = first.into_bytes().unwrap();
    let mut resumed = fused().from_bytes(bytes).unwrap();
    let resumed_model = steps(halfway.clone(), &mut resumed, 2..4);
    assert_eq!(bits(&resumed_model), bits(&uninterrupted));
    // Burn's Sgd's record continues under FusedSgd, and FusedSgd's under Burn's Sgd.
    let mut burn_first = burn();
    let burn_halfway = steps(model(), &mut burn_first, 0..2);
    let mut into_fused = fused()
        .from_bytes(burn_first.into_bytes().unwrap())
        .unwrap();
    let from_burn = steps(burn_halfway, &mut into_fused, 2..4);
    assert_eq!(bits(&from_burn), bits(&uninterrupted));
    let mut into_burn = burn().from_bytes(first.into_bytes().unwrap()).unwrap();
    let from_fused = steps(halfway, &mut into_burn, 2..4);
    assert_eq!(bits(&from_fused), bits(&uninterrupted));
    // The control: without the velocity the run ends elsewhere.
    let fresh = steps(steps(model(), &mut fused(), 0..2), &mut fused(), 2..4);
    assert_ne!(bits(&fresh), bits(&uninterrupted));
}
