//! `FusedAdamW` against Burn's `AdamW`: bit for bit over several steps for every setting the
//! kernel distinguishes, at any thread count, with shared buffers and strided gradients;
//! through `ModuleOptimizer`, with records exchangeable between the two.

use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWState, GradientsParams, ModuleOptimizer, Optimizer};
use burn::tensor::{DType, Device, Distribution, Tensor};

use super::FusedAdamWConfig;
use crate::test_support::{in_pool, values};

/// Elements per test tensor: several of the kernel's parallel pieces, and a ragged end.
const LEN: usize = 3 * (1 << 14) + 123;

/// Every setting the kernel distinguishes: decay scaled, none, cautious; AMSGrad; other betas.
fn configs() -> Vec<FusedAdamWConfig> {
    vec![
        FusedAdamWConfig::new(),
        FusedAdamWConfig::new().with_weight_decay(0.1),
        FusedAdamWConfig::new().with_weight_decay(0.0),
        FusedAdamWConfig::new()
            .with_weight_decay(0.1)
            .with_cautious_weight_decay(true),
        FusedAdamWConfig::new().with_amsgrad(true),
        FusedAdamWConfig::new()
            .with_beta_1(0.8)
            .with_beta_2(0.95)
            .with_epsilon(1e-8)
            .with_weight_decay(0.01)
            .with_amsgrad(true),
    ]
}

fn tensor(seed: u64) -> Tensor<2> {
    Tensor::<1>::from_floats(values(LEN, seed).as_slice(), &Device::flex()).reshape([3, LEN / 3])
}

fn bits(t: &Tensor<2>) -> Vec<u32> {
    let values = t.to_data().try_to_vec::<f32>().unwrap();
    values.iter().map(|v| v.to_bits()).collect()
}

/// A state's every tensor, bits.
fn state_bits(state: &AdamWState<2>) -> Vec<Vec<u32>> {
    let m = &state.momentum;
    let mut all = vec![bits(&m.moment_1), bits(&m.moment_2)];
    all.extend(m.max_moment_2.as_ref().map(bits));
    all
}

/// Four steps of `optimizer` from seeded parameters and gradients (the learning rate varies,
/// as a schedule's does): the parameter and the state.
fn four_steps(optimizer: &impl Optimizer<State<2> = AdamWState<2>>) -> (Tensor<2>, AdamWState<2>) {
    let mut param = tensor(1);
    let mut state = None;
    for step in 0..4u64 {
        let lr = 1e-2 / (1 + step) as f64;
        let (p, s) = optimizer.step(lr, param, tensor(10 + step), state);
        (param, state) = (p, s);
    }
    (param, state.expect("AdamW keeps a state"))
}

#[test]
fn the_kernel_steps_exactly_like_burns_adamw_at_any_thread_count() {
    for config in configs() {
        let (want, want_state) = four_steps(&config.burn().build());
        assert_ne!(bits(&want), bits(&tensor(1)), "{config:?}: nothing changed");
        for threads in [1, 2, 3] {
            let (got, got_state) = in_pool(threads, || four_steps(&config.build()));
            assert_eq!(bits(&got), bits(&want), "{config:?}, {threads} threads");
            assert_eq!(
                state_bits(&got_state),
                state_bits(&want_state),
                "{config:?}"
            );
            assert_eq!(got_state.momentum.time, 4);
        }
    }
}

/// The control: another epsilon than Burn's is told apart.
#[test]
fn another_epsilon_steps_differently() {
    let burn = FusedAdamWConfig::new().burn().build();
    let other = FusedAdamWConfig::new().with_epsilon(2e-5).build();
    assert_ne!(bits(&four_steps(&other).0), bits(&four_steps(&burn).0));
}

#[test]
fn shared_buffers_keep_their_values_and_strided_gradients_are_read_in_order() {
    let config = FusedAdamWConfig::new()
        .with_weight_decay(0.1)
        .with_amsgrad(true);
    let (param, grad) = (tensor(1), tensor(2));
    let (first, state) = config.build().step(1e-2, param.clone(), grad.clone(), None);
    let state = state.unwrap();
    let kept = state_bits(&state);
    // The parameter and the state are held elsewhere: the step copies instead of writing.
    let (got, _) = config
        .build()
        .step(1e-2, first.clone(), grad.clone(), Some(state.clone()));
    assert_eq!(state_bits(&state), kept, "a shared state was overwritten");
    assert_eq!(
        bits(&param),
        bits(&tensor(1)),
        "a shared parameter was overwritten"
    );
    let (want, _) = config.burn().build().step(1e-2, first, grad, Some(state));
    assert_eq!(bits(&got), bits(&want));
    // A transposed (strided) gradient, against the same values made contiguous.
    let square = |seed| {
        Tensor::<1>::from_floats(values(300 * 300, seed).as_slice(), &Device::flex())
            .reshape([300, 300])
    };
    let strided = square(3).transpose();
    let contiguous = Tensor::<2>::from_data(strided.to_data(), &Device::flex());
    let (a, _) = config.build().step(1e-2, square(4), strided, None);
    let (b, _) = config
        .burn()
        .build()
        .step(1e-2, square(4), contiguous, None);
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn other_dtypes_run_burns_adamw() {
    let device = Device::flex();
    let f64s =
        |seed| Tensor::<1>::from_floats(values(1000, seed).as_slice(), &device).cast(DType::F64);
    let config = FusedAdamWConfig::new().with_weight_decay(0.1);
    let (got, _) = config.build().step(1e-2, f64s(1), f64s(2), None);
    let (want, _) = config.burn().build().step(1e-2, f64s(1), f64s(2), None);
    assert_eq!(got.dtype(), DType::F64);
    assert_eq!(got.to_data(), want.to_data());
}

fn model() -> Linear {
    let device = Device::flex().autodiff();
    kiln_core::init_module(&device, 7, || LinearConfig::new(48, 40).init(&device))
}

/// `optimizer`'s steps `from..to` of `model` (each step's input seeded by its index).
fn steps(
    mut model: Linear,
    optimizer: &mut ModuleOptimizer,
    range: std::ops::Range<u64>,
) -> Linear {
    let device = Device::flex().autodiff();
    for step in range {
        let x = kiln_core::init_module(&device, step, || {
            Tensor::<2>::random([16, 48], Distribution::Default, &device)
        });
        let loss = model.forward(x).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(1e-2, model, grads);
    }
    model
}

fn model_bits(model: &Linear) -> Vec<u32> {
    let weight = model.weight.val().into_data().try_to_vec::<f32>().unwrap();
    let bias = model.bias.as_ref().unwrap().val().into_data();
    let bias = bias.try_to_vec::<f32>().unwrap();
    weight.iter().chain(&bias).map(|v| v.to_bits()).collect()
}

#[test]
fn a_record_resumes_the_run_exactly_and_is_exchangeable_with_burns() {
    for config in [
        FusedAdamWConfig::new().with_weight_decay(0.1),
        FusedAdamWConfig::new().with_amsgrad(true),
    ] {
        let fused = || config.init();
        let burn = || config.burn().init();
        let uninterrupted = steps(model(), &mut fused(), 0..4);
        assert_eq!(
            model_bits(&uninterrupted),
            model_bits(&steps(model(), &mut burn(), 0..4))
        );
        let mut first = fused();
        let halfway = steps(model(), &mut first, 0..2);
        let mut resumed = fused().from_bytes(first.into_bytes().unwrap()).unwrap();
        assert_eq!(
            model_bits(&steps(halfway.clone(), &mut resumed, 2..4)),
            model_bits(&uninterrupted)
        );
        // Burn's AdamW's record continues under FusedAdamW, and FusedAdamW's under Burn's.
        let mut burn_first = burn();
        let burn_halfway = steps(model(), &mut burn_first, 0..2);
        let mut into_fused = fused()
            .from_bytes(burn_first.into_bytes().unwrap())
            .unwrap();
        assert_eq!(
            model_bits(&steps(burn_halfway, &mut into_fused, 2..4)),
            model_bits(&uninterrupted)
        );
        let mut into_burn = burn().from_bytes(first.into_bytes().unwrap()).unwrap();
        assert_eq!(
            model_bits(&steps(halfway.clone(), &mut into_burn, 2..4)),
            model_bits(&uninterrupted)
        );
        // The control: without the moments the run ends elsewhere.
        let fresh = steps(halfway, &mut fused(), 2..4);
        assert_ne!(model_bits(&fresh), model_bits(&uninterrupted));
    }
}
