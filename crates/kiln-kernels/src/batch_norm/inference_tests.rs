//! kiln's inference-mode batch norm equals Burn's `batch_norm` (running statistics) to 1e-5
//! of the largest output, on Flex and under autodiff (gradients included), and does not
//! depend on the thread count.

use burn::tensor::module::{batch_norm, batch_norm_train};
use burn::tensor::{DType, Device, Distribution, Tensor};

use crate::batch_norm_inference;
use crate::test_support::in_pool;
use crate::test_support::tensor_relative_error as relative_error;

const TOLERANCE: f32 = 1e-5;

/// `x`, `gamma`, `beta` and running statistics far from `x`'s own (mean 0.5, variance
/// 0.5–2.5 against `x`'s mean `offset` and variance 4).
fn inputs(device: &Device, shape: [usize; 4], offset: f64) -> [Tensor<1>; 4] {
    let c = shape[1];
    [
        Tensor::<1>::random([c], Distribution::Normal(1.0, 0.3), device),
        Tensor::<1>::random([c], Distribution::Normal(0.0, 0.3), device),
        Tensor::<1>::random([c], Distribution::Normal(0.5 + offset, 1.0), device),
        Tensor::<1>::random([c], Distribution::Uniform(0.5, 2.5), device),
    ]
}

fn kiln(x: Tensor<4>, [gamma, beta, mean, variance]: [Tensor<1>; 4]) -> Tensor<4> {
    batch_norm_inference(x, (gamma, beta), (mean, variance), 1e-5)
}

fn burn(x: Tensor<4>, [gamma, beta, mean, variance]: [Tensor<1>; 4]) -> Tensor<4> {
    batch_norm(x, gamma, beta, mean, variance, 1e-5)
}

const SHAPES: [([usize; 4], f64); 4] = [
    ([4, 3, 5, 5], 0.0),
    ([2, 8, 7, 3], 3.0),
    ([16, 5, 1, 1], -1.0),
    ([1, 4, 6, 6], 0.5),
];

#[test]
fn inference_batch_norm_equals_burns() {
    let device = Device::flex();
    for (shape, offset) in SHAPES {
        let x = Tensor::<4>::random(shape, Distribution::Normal(offset, 2.0), &device);
        let params = inputs(&device, shape, offset);
        let error = relative_error(kiln(x.clone(), params.clone()), burn(x, params));
        assert!(error <= TOLERANCE, "{shape:?}: output differs by {error}");
    }
}

#[test]
fn the_batchs_own_statistics_fail_the_comparison() {
    // The control: normalising with the batch's statistics (training mode, the classic
    // evaluation bug) instead of the running ones is far outside the tolerance.
    let device = Device::flex();
    let (shape, offset) = SHAPES[0];
    let x = Tensor::<4>::random(shape, Distribution::Normal(offset, 2.0), &device);
    let params = inputs(&device, shape, offset);
    let [gamma, beta, ..] = params.clone();
    let training = batch_norm_train(x.clone(), gamma, beta, 1e-5).output;
    assert!(relative_error(training, kiln(x, params)) > 1e-2);
}

#[test]
fn under_autodiff_the_gradients_are_burns() {
    let device = Device::flex().autodiff();
    for (shape, offset) in SHAPES {
        let x = Tensor::<4>::random(shape, Distribution::Normal(offset, 2.0), &device);
        let upstream = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let params = inputs(&device, shape, offset);
        let gradients = |f: fn(Tensor<4>, [Tensor<1>; 4]) -> Tensor<4>| {
            let x = x.clone().require_grad();
            let [g, b, m, v] = params.clone().map(|t| t.detach());
            let (g, b) = (g.require_grad(), b.require_grad());
            let output = f(x.clone(), [g.clone(), b.clone(), m, v]);
            let grads = (output * upstream.clone()).sum().backward();
            let grad = |t: &Tensor<1>| t.grad(&grads).expect("a gradient");
            (x.grad(&grads).expect("x gradient"), grad(&g), grad(&b))
        };
        let (got, want) = (gradients(kiln), gradients(burn));
        for (what, error) in [
            ("x", relative_error(got.0, want.0)),
            ("gamma", relative_error(got.1, want.1)),
            ("beta", relative_error(got.2, want.2)),
        ] {
            assert!(
                error <= TOLERANCE,
                "{shape:?}: {what} gradient differs by {error}"
            );
        }
    }
}

#[test]
fn inference_batch_norm_does_not_depend_on_the_thread_count() {
    let device = Device::flex();
    let shape = [6, 5, 9, 9];
    let x = Tensor::<4>::random(shape, Distribution::Normal(0.7, 2.0), &device);
    let params = inputs(&device, shape, 0.7);
    let run = |threads: usize| in_pool(threads, || kiln(x.clone(), params.clone()));
    run(1).into_data().assert_eq(&run(3).into_data(), true);
}

#[test]
fn half_precision_input_is_computed_in_f32_and_cast_back() {
    let device = Device::flex();
    let shape = [4, 3, 5, 5];
    let x = Tensor::<4>::random(shape, Distribution::Normal(0.0, 2.0), &device);
    let params = inputs(&device, shape, 0.0);
    let want = burn(x.clone(), params.clone());
    let half = kiln(x.cast(DType::BF16), params.map(|t| t.cast(DType::BF16)));
    assert_eq!(half.dtype(), DType::BF16);
    // bf16 rounds each input and output to 2^-8 of its value.
    let error = relative_error(half.cast(DType::F32), want);
    assert!(error < 3e-2, "bf16 differs by {error}");
}
