//! kiln's batch norm equals Burn's — output, statistics and the gradients of input, gamma and
//! beta — to 1e-4 of the largest value (measured below 1e-6 here), and does not depend on
//! the thread count.

use burn::tensor::module::batch_norm_train as burn_batch_norm_train;
use burn::tensor::{DType, Device, Distribution, Tensor};

use crate::batch_norm_train;
use crate::test_support::tensor_relative_error as relative_error;

const TOLERANCE: f32 = 1e-4;

/// Output, mean, variance, and the gradients of x, gamma, beta for `sum(output · upstream)`.
struct Run {
    output: Tensor<4>,
    mean: Tensor<1>,
    variance: Tensor<1>,
    x_grad: Tensor<4>,
    gamma_grad: Tensor<1>,
    beta_grad: Tensor<1>,
}

fn run(inputs: &(Tensor<4>, Tensor<1>, Tensor<1>, Tensor<4>), kiln: bool) -> Run {
    let (x, gamma, beta, upstream) = inputs;
    let x = x.clone().detach().require_grad();
    let gamma = gamma.clone().detach().require_grad();
    let beta = beta.clone().detach().require_grad();
    let (output, mean, variance) = if kiln {
        let r = batch_norm_train(x.clone(), gamma.clone(), beta.clone(), 1e-5);
        (r.output, r.mean, r.variance)
    } else {
        let r = burn_batch_norm_train(x.clone(), gamma.clone(), beta.clone(), 1e-5);
        (r.output, r.mean, r.variance)
    };
    let grads = (output.clone() * upstream.clone()).sum().backward();
    Run {
        output: output.detach(),
        mean: mean.detach(),
        variance: variance.detach(),
        x_grad: x.grad(&grads).expect("x grad"),
        gamma_grad: gamma.grad(&grads).expect("gamma grad"),
        beta_grad: beta.grad(&grads).expect("beta grad"),
    }
}

fn inputs(
    device: &Device,
    shape: [usize; 4],
    offset: f64,
) -> (Tensor<4>, Tensor<1>, Tensor<1>, Tensor<4>) {
    let c = shape[1];
    (
        Tensor::<4>::random(shape, Distribution::Normal(offset, 2.0), device),
        Tensor::<1>::random([c], Distribution::Normal(1.0, 0.3), device),
        Tensor::<1>::random([c], Distribution::Normal(0.0, 0.3), device),
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device),
    )
}

#[test]
fn kiln_batch_norm_equals_burns() {
    let device = Device::flex().autodiff();
    for (shape, offset) in [
        ([4, 3, 5, 5], 0.0),
        ([2, 8, 7, 3], 3.0),
        ([16, 5, 1, 1], -1.0),
        ([1, 4, 6, 6], 0.5),
    ] {
        let inputs = inputs(&device, shape, offset);
        let (got, want) = (run(&inputs, true), run(&inputs, false));
        let errors = [
            ("output", relative_error(got.output, want.output)),
            ("x gradient", relative_error(got.x_grad, want.x_grad)),
            ("mean", relative_error(got.mean, want.mean)),
            ("variance", relative_error(got.variance, want.variance)),
            (
                "gamma gradient",
                relative_error(got.gamma_grad, want.gamma_grad),
            ),
            (
                "beta gradient",
                relative_error(got.beta_grad, want.beta_grad),
            ),
        ];
        for (what, error) in errors {
            assert!(error <= TOLERANCE, "{shape:?}: {what} differs by {error}");
        }
    }
}

#[test]
fn a_batch_norm_without_the_statistics_gradient_fails_the_comparison() {
    // The control: treating mean and variance as constants in backward (the classic mistake)
    // changes the input gradient far beyond the tolerance.
    let device = Device::flex().autodiff();
    let (x, gamma, beta, upstream) = inputs(&device, [4, 3, 5, 5], 1.0);
    let want = run(
        &(x.clone(), gamma.clone(), beta.clone(), upstream.clone()),
        true,
    );
    let x = x.detach().require_grad();
    let stats = burn_batch_norm_train(x.clone().detach(), gamma.clone(), beta.clone(), 1e-5);
    let mean = stats.mean.reshape([1, 3, 1, 1]);
    let std = (stats.variance.reshape([1, 3, 1, 1]) + 1e-5).sqrt();
    let output =
        (x.clone() - mean) / std * gamma.reshape([1, 3, 1, 1]) + beta.reshape([1, 3, 1, 1]);
    let grads = (output * upstream).sum().backward();
    let wrong = x.grad(&grads).expect("x grad");
    assert!(relative_error(wrong, want.x_grad) > 1e-2);
}

/// The backward overwrites the output gradient when nothing else holds it and copies it
/// otherwise: here a residual `add_relu` hands the same gradient tensor to the batch norm
/// and to the other input, and the input gradient must equal the one computed from an
/// unshared gradient of the same values, bit for bit.
#[test]
fn a_shared_output_gradient_gives_the_same_input_gradient() {
    let device = Device::flex().autodiff();
    let (x, gamma, beta, upstream) = inputs(&device, [4, 3, 5, 5], 0.3);
    let other = Tensor::<4>::random([4, 3, 5, 5], Distribution::Normal(0.0, 1.0), &device);
    let (x, other) = (x.detach().require_grad(), other.require_grad());
    let out = batch_norm_train(x.clone(), gamma.clone(), beta.clone(), 1e-5).output;
    let z = crate::add_relu(out, other.clone());
    let mask = z.clone().detach().greater_elem(0.0).float();
    let grads = (z * upstream.clone()).sum().backward();
    let shared = x.grad(&grads).expect("x grad");
    assert!(other.grad(&grads).is_some());
    let x2 = x.detach().require_grad();
    let out2 = batch_norm_train(x2.clone(), gamma, beta, 1e-5).output;
    let unique = x2.grad(&(out2 * (upstream * mask)).sum().backward());
    shared
        .into_data()
        .assert_eq(&unique.expect("x grad").into_data(), true);
}

#[test]
fn batch_norm_does_not_depend_on_the_thread_count() {
    let device = Device::flex().autodiff();
    let inputs = inputs(&device, [6, 5, 9, 9], 0.7);
    let in_pool = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool")
            .install(|| run(&inputs, true))
    };
    let (one, three) = (in_pool(1), in_pool(3));
    one.output
        .into_data()
        .assert_eq(&three.output.into_data(), true);
    one.x_grad
        .into_data()
        .assert_eq(&three.x_grad.into_data(), true);
    one.gamma_grad
        .into_data()
        .assert_eq(&three.gamma_grad.into_data(), true);
}

#[test]
fn half_precision_batch_norm_is_computed_in_f32_and_cast_back() {
    // bf16 inputs: the result comes back in bf16 and within bf16's rounding (2^-8 per value,
    // 2e-2 with room) of the f32 normalisation of the same rounded inputs, also with a mean
    // (6) that is large next to the spread.
    let device = Device::flex().autodiff();
    let (x, gamma, beta, upstream) = inputs(&device, [4, 3, 5, 5], 6.0);
    let round = |t: Tensor<4>| t.cast(DType::BF16).cast(DType::F32);
    let want = run(
        &(
            round(x.clone()),
            gamma.clone(),
            beta.clone(),
            upstream.clone(),
        ),
        false,
    );
    let half = |t: Tensor<1>| t.cast(DType::BF16);
    let inputs = (
        x.cast(DType::BF16),
        half(gamma),
        half(beta),
        upstream.cast(DType::BF16),
    );
    let got = run(&inputs, true);
    assert_eq!(got.output.dtype(), DType::BF16);
    assert_eq!(got.x_grad.dtype(), DType::BF16);
    for (what, error) in [
        (
            "output",
            relative_error(got.output.cast(DType::F32), want.output),
        ),
        (
            "x gradient",
            relative_error(got.x_grad.cast(DType::F32), want.x_grad),
        ),
    ] {
        assert!(error <= 2e-2, "bf16 {what} differs by {error}");
    }
}
