//! One device in mixed precision and with clipping: skipped overflow steps, f16/bf16
//! training close to f32 with f32 master weights, and the global-norm clip.
//!
//! Tolerance: after 60 steps, the validation loss (1024 held-out samples, f32 evaluation)
//! of the f16/bf16 run is within 0.1 (absolute) of the f32 run's.

use burn::module::Module;
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::{DType, Device};
use kiln_amp::{AmpPolicy, GradScaler, GradScalerConfig, MixedPrecision, Precision, module_dtypes};
use kiln_core::{FlatLayout, init_module, param_infos, read_params};
use kiln_data::{DataLoader, SyntheticImages};
use kiln_resnet::{ResNet, ResNetConfig, StemKind};

use crate::{LocalStep, LrSchedule, TrainReport, Trainer};

fn model(device: &Device) -> ResNet {
    init_module(device, 3, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(4)
            .init(device)
    })
}

fn data() -> SyntheticImages {
    SyntheticImages::new(512, 4, 2, [3, 8, 8]).with_noise(0.5)
}

/// Trainable parameters (the forward of a skipped step still updates batch-norm statistics,
/// as in PyTorch).
fn params<M: Module>(model: &M) -> Vec<f32> {
    read_params(
        model,
        &FlatLayout::new(param_infos(model).into_iter().filter(|p| p.trainable)),
    )
}

fn train(step: LocalStep, steps: usize, momentum: bool, lr: f64) -> (ResNet, TrainReport) {
    let device = Device::flex().autodiff();
    let momentum = momentum.then(|| MomentumConfig::new().with_momentum(0.9));
    Trainer::builder(
        model(&device),
        SgdConfig::new().with_momentum(momentum).init(),
    )
    .gradient_step(step)
    .schedule(LrSchedule::constant(lr))
    .train_loader(
        DataLoader::builder(data())
            .batch_size(32)
            .shuffle(1)
            .device(device)
            .build(),
    )
    .max_steps(steps)
    .progress(false)
    .log_epochs(false)
    .build()
    .unwrap()
    .fit()
    .unwrap()
}

#[test]
fn a_planted_overflow_skips_the_step_halves_the_scale_and_leaves_parameters_unchanged() {
    // A scale of 2^40 overflows f16 gradients (max 65504) on the first backward.
    let scaler = GradScaler::new(GradScalerConfig {
        init_scale: 2f32.powi(40),
        ..GradScalerConfig::default()
    });
    let step =
        LocalStep::new().with_precision(MixedPrecision::new(Precision::F16).with_scaler(scaler));
    let stats = step.stats();
    let before = params(&model(&Device::flex().autodiff()));
    let (trained, _) = train(step, 1, true, 0.02);
    assert_eq!(
        params(&trained),
        before,
        "the skipped step changed nothing (not even momentum could)"
    );
    let stats = *stats.lock().unwrap();
    assert_eq!((stats.steps, stats.skipped), (1, 1));
    assert_eq!(stats.scale, 2f32.powi(39));
}

#[test]
fn half_precision_training_reaches_the_f32_loss_with_f32_master_weights() {
    let steps = 60;
    let valid = |model: &ResNet| {
        let mut loader = DataLoader::builder(data().split(1024, 9))
            .batch_size(256)
            .build();
        crate::evaluate(&model.valid(), &mut loader).unwrap().loss
    };
    let (full_model, full) = train(LocalStep::new(), steps, true, 0.02);
    let want = valid(&full_model);
    assert!(
        want < 0.3 * full.losses()[0],
        "f32 learns: {} -> {want}",
        full.losses()[0]
    );
    let variants = [
        (Precision::F16, AmpPolicy::default()),
        (Precision::Bf16, AmpPolicy::default()),
        (Precision::Bf16, AmpPolicy::cast_everything()),
    ];
    for (precision, policy) in variants {
        let shown = format!("{policy:?}");
        let step =
            LocalStep::new().with_precision(MixedPrecision::new(precision).with_policy(policy));
        let stats = step.stats();
        let (model, _) = train(step, steps, true, 0.02);
        let got = valid(&model);
        // Shown with --nocapture: the figures a CPU of another kind gives (see the README).
        eprintln!("{precision} ({shown}): validation loss {got}, f32 {want}");
        assert!(
            (got - want).abs() <= 0.1,
            "{precision}: validation loss {got} vs f32 {want}"
        );
        assert!(
            module_dtypes(&model).iter().all(|d| *d == DType::F32),
            "{precision}: master weights are f32"
        );
        // Dynamic scaling may skip a step or two while the scale finds its level.
        assert!(
            stats.lock().unwrap().skipped <= 2,
            "{precision}: {:?}",
            stats.lock().unwrap()
        );
    }
}

/// Plain SGD moves parameters by `lr × g`: clipped, the whole step's norm is `lr × max`.
#[test]
fn clipping_limits_the_global_norm_of_the_update_and_spares_small_gradients() {
    let lr = 0.5;
    let before = params(&model(&Device::flex().autodiff()));
    let step_norm = |step: LocalStep| {
        let (trained, _) = train(step, 1, false, lr);
        let after = params(&trained);
        let squares: f64 = after
            .iter()
            .zip(&before)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        squares.sqrt() / lr
    };
    let unclipped = step_norm(LocalStep::new());
    assert!(
        unclipped > 0.2,
        "the test needs a gradient to clip: {unclipped}"
    );
    let max = (unclipped / 4.0) as f32;
    let clipped = step_norm(LocalStep::new().with_max_grad_norm(max).unwrap());
    assert!(
        (clipped - f64::from(max)).abs() <= 1e-3 * f64::from(max),
        "clipped to {max}: the update's norm is {clipped}"
    );
    let loose = step_norm(
        LocalStep::new()
            .with_max_grad_norm(4.0 * unclipped as f32)
            .unwrap(),
    );
    assert!(
        (loose - unclipped).abs() <= 1e-4 * unclipped,
        "a norm below the limit is untouched: {loose} vs {unclipped}"
    );
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let err = LocalStep::new().with_max_grad_norm(bad).unwrap_err();
        assert!(err.to_string().contains("maximum gradient norm"), "{err}");
    }
}

#[test]
fn summed_summaries_stay_finite_beyond_f32s_range_of_squares() {
    use crate::GradientSummary;
    use kiln_comm::ReduceOp;
    // Two ranks, simulated: each all-reduce combines this rank's values with a peer's.
    let peer = |rank_values: Vec<f32>, op: ReduceOp, peer_values: Vec<f32>| {
        rank_values
            .iter()
            .zip(&peer_values)
            .map(|(a, b)| match op {
                ReduceOp::Max => a.max(*b),
                _ => a + b,
            })
            .collect::<Vec<f32>>()
    };
    // In range: one round, exact sums.
    let small = GradientSummary {
        non_finite: false,
        squared_norm: 3.0,
    };
    let summed = small
        .sum_over_ranks(|v, op| Ok(peer(v, op, vec![0.0, 4.0, 0.0])))
        .expect("summed");
    assert_eq!(
        summed,
        GradientSummary {
            non_finite: false,
            squared_norm: 7.0
        }
    );
    // A squared norm of 1e40 (norm 1e20) beside a peer's equal one: 2e40, not an overflow.
    let wide = GradientSummary {
        non_finite: false,
        squared_norm: 1e40,
    };
    let mut rounds = vec![vec![0.0, f32::INFINITY, 1.0], vec![1e20], vec![1.0]].into_iter();
    let summed = wide
        .sum_over_ranks(|v, op| Ok(peer(v, op, rounds.next().expect("three rounds"))))
        .expect("summed");
    assert!(!summed.non_finite, "{summed:?}");
    assert!(
        (summed.squared_norm / 2e40 - 1.0).abs() < 1e-6,
        "{summed:?}"
    );
    // A real overflow still reads as one.
    let bad = GradientSummary {
        non_finite: true,
        squared_norm: f64::INFINITY,
    };
    let summed = bad
        .sum_over_ranks(|v, op| Ok(peer(v, op, vec![0.0, 1.0, 0.0])))
        .expect("summed");
    assert!(summed.non_finite);
}

#[test]
fn the_loss_scaler_survives_a_checkpoint_and_a_mismatch_is_refused() {
    use crate::{MeanGradient, StepState};
    let scaler = GradScaler::new(GradScalerConfig {
        init_scale: 1024.0,
        growth_interval: 3,
        ..GradScalerConfig::default()
    });
    let mut saved = MeanGradient::new(MixedPrecision::new(Precision::F16).with_scaler(scaler));
    let state = saved.saved_state();
    assert_eq!(state["scaler"]["scale"], 1024.0);
    // A fresh f16 step continues with the saved scaler (its scale and growth counter).
    let mut fresh = MeanGradient::new(MixedPrecision::new(Precision::F16));
    assert_eq!(fresh.precision().loss_scale(), 65536.0);
    fresh.restore_state(&state).unwrap();
    assert_eq!(fresh.saved_state(), state);
    assert_eq!(fresh.precision().loss_scale(), 1024.0);
    // Nothing saved: nothing changes; f32 state into f16 and f16 state into f32: refused.
    saved.restore_state(&StepState::Null).unwrap();
    let f32_state = MeanGradient::new(MixedPrecision::f32()).saved_state();
    let err = fresh.restore_state(&f32_state).unwrap_err();
    assert!(err.to_string().contains("needs one"), "{err}");
    let mut plain = MeanGradient::new(MixedPrecision::f32());
    let err = plain.restore_state(&state).unwrap_err();
    assert!(err.to_string().contains("has none"), "{err}");
}
