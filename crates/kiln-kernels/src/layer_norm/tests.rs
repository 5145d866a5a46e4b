//! kiln's layer norm against Burn's: output and the input, scale and shift gradients within
//! float rounding, independent of the thread count, with a control (another epsilon) that
//! must miss.

use burn::tensor::module;
use burn::tensor::{Device, Tensor, TensorData};
use kiln_test_support::tolerance::SAME_ORDER;

use crate::layer_norm;
use crate::test_support::{in_pool, tensor_relative_error as relative_error, values};

fn tensor<const D: usize>(shape: [usize; D], seed: u64, shift: f32, device: &Device) -> Tensor<D> {
    let data = values(shape.iter().product(), seed)
        .into_iter()
        .map(|v| 3.0 * v + shift)
        .collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// The output and the input, scale and shift gradients under an upstream gradient.
fn run(
    norm: impl Fn(Tensor<3>, Tensor<1>, Option<Tensor<1>>) -> Tensor<3>,
    shape: [usize; 3],
) -> [Tensor<3>; 2] {
    let device = Device::flex().autodiff();
    let x = tensor(shape, 1, 0.5, &device).require_grad();
    let gamma = tensor([shape[2]], 2, 1.0, &device).require_grad();
    let beta = tensor([shape[2]], 3, 0.0, &device).require_grad();
    let output = norm(x.clone(), gamma.clone(), Some(beta.clone()));
    let grads = (output.clone() * tensor(shape, 4, 0.0, &device))
        .sum()
        .backward();
    let parameters = Tensor::cat(
        vec![
            gamma.grad(&grads).expect("gamma"),
            beta.grad(&grads).expect("beta"),
        ],
        0,
    );
    [
        Tensor::cat(vec![output.inner(), x.grad(&grads).expect("x")], 0),
        parameters.reshape([1, 1, 2 * shape[2]]),
    ]
}

fn burns(x: Tensor<3>, gamma: Tensor<1>, beta: Option<Tensor<1>>) -> Tensor<3> {
    module::layer_norm(x, gamma, beta, 1e-5)
}

/// Measured on the development machine: at most 2.5e-7 of the largest value.
#[test]
fn equals_burns_layer_norm_output_and_gradients() {
    for shape in [[3, 17, 12], [2, 70, 128], [1, 1, 5]] {
        let ours = run(|x, g, b| layer_norm(x, g, b, 1e-5), shape);
        let theirs = run(burns, shape);
        for (name, (a, b)) in ["output and input", "scale and shift"]
            .iter()
            .zip(ours.into_iter().zip(theirs))
        {
            let error = relative_error(a, b);
            assert!(error < SAME_ORDER, "{name} at {shape:?}: {error}");
        }
    }
}

/// The control: another epsilon misses the tolerance the test above meets.
#[test]
fn another_epsilon_fails_the_comparison() {
    let shape = [2, 9, 8];
    let [ours, _] = run(|x, g, b| layer_norm(x, g, b, 1e-1), shape);
    let [theirs, _] = run(burns, shape);
    assert!(relative_error(ours, theirs) > 1e-3);
}

/// One thread or three: the same bits, output and gradients (over more rows than a piece).
#[test]
fn the_thread_count_does_not_change_a_bit() {
    let bits = |threads| {
        in_pool(threads, || {
            run(|x, g, b| layer_norm(x, g, b, 1e-5), [3, 50, 24]).map(|t| t.into_data())
        })
    };
    assert_eq!(bits(1), bits(3));
}

/// Without a shift, and in half precision (Burn's), the results still agree with Burn's.
#[test]
fn no_shift_and_half_precision() {
    let device = Device::flex();
    let x = tensor([4, 6], 1, 0.0, &device);
    let gamma = tensor([6], 2, 1.0, &device);
    let ours = layer_norm(x.clone(), gamma.clone(), None, 1e-5);
    let theirs = module::layer_norm(x.clone(), gamma.clone(), None, 1e-5);
    assert!(relative_error(ours, theirs) < SAME_ORDER);
    let half = x.cast(burn::tensor::DType::F16);
    let gamma = gamma.cast(burn::tensor::DType::F16);
    let ours = layer_norm(half.clone(), gamma.clone(), None, 1e-5);
    assert_eq!(
        ours.into_data(),
        module::layer_norm(half, gamma, None, 1e-5).into_data()
    );
}
