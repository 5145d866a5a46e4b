//! kiln's ReLU and residual addition + ReLU equal Burn's bit for bit, and its GELU Burn's within a
//! stated tolerance: outputs and gradients, with NaN, signed zeros, shared and strided inputs,
//! on the in-place and the copying paths.

use burn::tensor::activation;
use burn::tensor::{DType, Device, Distribution, Tensor, TensorData};
use kiln_core::with_seed;

use crate::{add_relu, gelu, relu};

fn bits<const D: usize>(t: Tensor<D>) -> Vec<u32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 values")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// `[4, 3, 40, 50]` values around zero (enough elements for several parallel pieces), with a
/// NaN, both zeros and an exact tie `a = −b` planted.
fn input(seed: u64, device: &Device) -> Tensor<4> {
    let x = with_seed(device, seed, || {
        Tensor::<4>::random([4, 3, 40, 50], Distribution::Normal(0.0, 1.0), device)
    });
    let mut values = x.into_data().try_to_vec::<f32>().expect("f32");
    values[7] = f32::NAN;
    values[8] = 0.0;
    values[9] = -0.0;
    Tensor::from_data(TensorData::new(values, [4, 3, 40, 50]), device)
}

#[test]
fn relu_equals_burns_output_and_gradient() {
    let device = Device::flex().autodiff();
    let upstream = input(3, &device);
    for strided in [false, true] {
        let base = input(1, &device);
        let x = if strided {
            base.swap_dims(2, 3).require_grad()
        } else {
            base.require_grad()
        };
        let ours = relu(x.clone());
        let theirs = activation::relu(x.clone());
        let up = if strided {
            upstream.clone().swap_dims(2, 3)
        } else {
            upstream.clone()
        };
        let g_ours = x
            .grad(&(ours.clone() * up.clone()).sum().backward())
            .expect("grad");
        let g_theirs = x
            .grad(&(theirs.clone() * up).sum().backward())
            .expect("grad");
        assert_eq!(bits(ours), bits(theirs), "strided {strided}");
        assert_eq!(bits(g_ours), bits(g_theirs), "strided {strided}");
    }
}

#[test]
fn add_relu_equals_burns_output_and_both_gradients() {
    let device = Device::flex().autodiff();
    let upstream = input(3, &device);
    let mut a_values = input(1, &device)
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32");
    let b = input(2, &device);
    // An exact tie: a + b = 0 at one element.
    let b_values = b.clone().into_data().try_to_vec::<f32>().expect("f32");
    a_values[11] = -b_values[11];
    let a = Tensor::<4>::from_data(TensorData::new(a_values, [4, 3, 40, 50]), &device);
    for shared in [false, true] {
        let (a, b) = (a.clone().require_grad(), b.clone().require_grad());
        let rhs = if shared { a.clone() } else { b.clone() };
        let ours = add_relu(a.clone(), rhs.clone());
        let theirs = activation::relu(a.clone() + rhs);
        let grads_ours = (ours.clone() * upstream.clone()).sum().backward();
        let grads_theirs = (theirs.clone() * upstream.clone()).sum().backward();
        assert_eq!(bits(ours), bits(theirs), "shared {shared}");
        let a_ours = a.grad(&grads_ours).expect("a grad");
        assert_eq!(bits(a_ours), bits(a.grad(&grads_theirs).expect("a grad")));
        if !shared {
            let b_ours = b.grad(&grads_ours).expect("b grad");
            assert_eq!(bits(b_ours), bits(b.grad(&grads_theirs).expect("b grad")));
        }
    }
}

/// Without autodiff, inputs that nothing else holds are overwritten in place (the first
/// operand, else the second), shared ones copied; every way gives Burn's values.
#[test]
fn in_place_and_copying_paths_equal_burns() {
    let device = Device::flex();
    let (a, b) = (input(4, &device), input(5, &device));
    let expected = bits(activation::relu(a.clone() + b.clone()));
    // Both shared, then only `a` shared, then neither.
    assert_eq!(bits(add_relu(a.clone(), b.clone())), expected);
    assert_eq!(bits(add_relu(a.clone(), b)), expected);
    let owned = add_relu(input(4, &device), input(5, &device));
    assert_eq!(bits(owned), expected);
    let expected = bits(activation::relu(a.clone()));
    assert_eq!(bits(relu(a.clone())), expected);
    assert_eq!(bits(relu(a)), expected);
}

/// The control: a residual added twice, or a ReLU that keeps the negatives' gradient, must
/// fail the comparison the tests above pass.
#[test]
fn a_changed_operation_fails_the_comparison() {
    let device = Device::flex().autodiff();
    let (a, b) = (input(1, &device), input(2, &device));
    let doubled = add_relu(a.clone(), b.clone() * 2.0);
    assert_ne!(bits(doubled), bits(activation::relu(a.clone() + b)));
    let x = a.require_grad();
    let leaky_grad = x.grad(&activation::leaky_relu(x.clone(), 1e-3).sum().backward());
    let ours = x.grad(&relu(x.clone()).sum().backward());
    assert_ne!(bits(leaky_grad.expect("grad")), bits(ours.expect("grad")));
}

/// Other dtypes and broadcast shapes take Burn's operations and still agree.
#[test]
fn other_dtypes_and_shapes_take_burns_operations() {
    let device = Device::flex();
    let a = input(1, &device).cast(DType::F16);
    assert_eq!(bits(relu(a.clone())), bits(activation::relu(a.clone())));
    let row = input(2, &device).narrow(0, 0, 1).cast(DType::F16);
    let expected = bits(activation::relu(a.clone() + row.clone()));
    assert_eq!(bits(add_relu(a, row)), expected);
}

/// The largest `|ours − theirs| / (1 + |x|)` over the elements (ours and Burn's GELU, or
/// their gradients, at inputs `x`).
fn gelu_error(ours: Vec<f32>, theirs: Vec<f32>, x: &[f32]) -> f32 {
    ours.iter()
        .zip(&theirs)
        .zip(x)
        .filter(|((_, _), x)| !x.is_nan())
        .map(|((a, b), x)| (a - b).abs() / (1.0 + x.abs()))
        .fold(0.0, f32::max)
}

fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 values")
}

/// Burn's GELU runs libm's `erff`; kiln's a vectorisable one within 2.5e-7 of it, so outputs
/// and gradients agree within [`GELU_TOLERANCE`] of `1 + |x|`.
const GELU_TOLERANCE: f32 = 4e-7;

#[test]
fn gelu_is_burns_within_its_tolerance_output_and_gradient() {
    let device = Device::flex().autodiff();
    let upstream = input(3, &device);
    for strided in [false, true] {
        let base = input(1, &device) * 3.0;
        let (x, up) = if strided {
            (
                base.swap_dims(2, 3).require_grad(),
                upstream.clone().swap_dims(2, 3),
            )
        } else {
            (base.require_grad(), upstream.clone())
        };
        let ours = gelu(x.clone());
        let theirs = activation::gelu(x.clone());
        let g_ours = x.grad(&(ours.clone() * up.clone()).sum().backward());
        let g_theirs = x.grad(&(theirs.clone() * up.clone()).sum().backward());
        let inputs = floats(x.clone().detach());
        let upstream_scale = floats(up.clone())
            .iter()
            .fold(0.0_f32, |m, v| m.max(v.abs()));
        let output_error = gelu_error(floats(ours.clone()), floats(theirs), &inputs);
        assert!(
            output_error <= GELU_TOLERANCE,
            "strided {strided}: output {output_error}"
        );
        let gradient_error = gelu_error(
            floats(g_ours.expect("grad")),
            floats(g_theirs.expect("grad")),
            &inputs,
        ) / upstream_scale;
        assert!(
            gradient_error <= GELU_TOLERANCE,
            "strided {strided}: gradient {gradient_error}"
        );
        // NaN in, NaN out.
        assert!(floats(ours)[7].is_nan() || strided);
    }
    // Untracked: in place when nothing else holds the input, copied when something does; the
    // same bits either way.
    let plain = Device::flex();
    let expected = bits(gelu(input(6, &plain)));
    let shared = input(6, &plain);
    assert_eq!(bits(gelu(shared.clone())), expected);
    assert_eq!(
        bits(shared),
        bits(input(6, &plain)),
        "a shared input stays intact"
    );
    // The control: the tanh approximation misses the tolerance.
    let x = input(6, &plain) * 3.0;
    let inputs = floats(x.clone());
    let approximate = floats(activation::gelu_approximate(x.clone()));
    let error = gelu_error(approximate, floats(activation::gelu(x)), &inputs);
    assert!(
        error > GELU_TOLERANCE,
        "the control met the tolerance: {error}"
    );
}

/// GELU's bits do not depend on the thread count (each element is computed alone).
#[test]
fn gelu_bits_do_not_depend_on_the_thread_count() {
    let plain = Device::flex();
    let run =
        |threads| crate::test_support::in_pool(threads, || bits(gelu(input(2, &plain) * 3.0)));
    assert_eq!(run(1), run(3));
}
