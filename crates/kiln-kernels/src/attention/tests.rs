//! kiln's causal attention against Burn's: outputs and all three gradients within float
//! rounding, at sizes that exercise several heads and sequences, independent of the thread
//! count, causal (a later position never changes an earlier output), with a control (a
//! non-causal attention) that must miss.

use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Tensor, TensorData};
use kiln_test_support::tolerance::SAME_ORDER;

use crate::causal_attention;
use crate::test_support::{in_pool, tensor_relative_error as relative_error, values};

/// Burn's attention on the same rows, split into heads (its composition under autodiff).
fn burns(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, heads: usize, causal: bool) -> Tensor<3> {
    let [batch, time, width] = q.dims();
    let split = |x: Tensor<3>| {
        x.reshape([batch, time, heads, width / heads])
            .swap_dims(1, 2)
    };
    let options = AttentionModuleOptions {
        is_causal: causal,
        ..Default::default()
    };
    attention(split(q), split(k), split(v), None, None, options)
        .swap_dims(1, 2)
        .reshape([batch, time, width])
}

fn rows(shape: [usize; 3], seed: u64, device: &Device) -> Tensor<3> {
    let data = values(shape.iter().product(), seed)
        .into_iter()
        .map(|v| 2.0 * v)
        .collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// The output and the query, key and value gradients under an upstream gradient.
fn run(
    attend: impl Fn(Tensor<3>, Tensor<3>, Tensor<3>) -> Tensor<3>,
    shape: [usize; 3],
) -> [Tensor<3>; 4] {
    let device = Device::flex().autodiff();
    let [q, k, v] = [1, 2, 3].map(|seed| rows(shape, seed, &device).require_grad());
    let output = attend(q.clone(), k.clone(), v.clone());
    let grads = (output.clone() * rows(shape, 4, &device)).sum().backward();
    let grad = |x: &Tensor<3>| x.grad(&grads).expect("a gradient");
    [output, grad(&q), grad(&k), grad(&v)]
}

/// Measured on the development machine: at most 2.7e-7 of the largest value, output and
/// gradients alike (the same products, summed by other kernels in another order).
#[test]
fn equals_burns_attention_output_and_gradients() {
    for (shape, heads) in [([3, 17, 12], 3), ([2, 40, 32], 4), ([1, 5, 8], 1)] {
        let ours = run(|q, k, v| causal_attention(q, k, v, heads), shape);
        let theirs = run(|q, k, v| burns(q, k, v, heads, true), shape);
        for (name, (a, b)) in ["output", "query", "key", "value"]
            .iter()
            .zip(ours.into_iter().zip(theirs))
        {
            let error = relative_error(a, b);
            assert!(error < SAME_ORDER, "{name} at {shape:?}/{heads}: {error}");
        }
    }
}

/// The control: attention that sees the future misses the tolerance the test above meets.
#[test]
fn a_non_causal_attention_fails_the_comparison() {
    let shape = [2, 9, 8];
    let ours = run(|q, k, v| causal_attention(q, k, v, 2), shape);
    let open = run(|q, k, v| burns(q, k, v, 2, false), shape);
    let [output, ..] = ours;
    let [open_output, ..] = open;
    assert!(relative_error(output, open_output) > 1e-2);
}

/// A change at the last position leaves every earlier output as it was, bit for bit.
#[test]
fn later_positions_do_not_reach_earlier_outputs() {
    let device = Device::flex();
    let shape = [2, 11, 8];
    let [q, k, v] = [1, 2, 3].map(|seed| rows(shape, seed, &device));
    let before = causal_attention(q.clone(), k.clone(), v.clone(), 2);
    let changed = |x: Tensor<3>| {
        x.clone()
            .slice_assign([0..2, 10..11, 0..8], Tensor::ones([2, 1, 8], &device))
    };
    let after = causal_attention(changed(q), changed(k), changed(v), 2);
    let early = |x: Tensor<3>| x.slice([0..2, 0..10, 0..8]).into_data();
    assert_eq!(early(before.clone()), early(after.clone()));
    assert_ne!(before.into_data(), after.into_data());
}

/// One thread or three: the same bits, output and gradients.
#[test]
fn the_thread_count_does_not_change_a_bit() {
    let shape = [5, 13, 12];
    let bits = |threads| {
        in_pool(threads, || {
            run(|q, k, v| causal_attention(q, k, v, 3), shape).map(|t| t.into_data())
        })
    };
    assert_eq!(bits(1), bits(3));
}

/// Other dtypes take Burn's attention and still agree with it.
#[test]
fn half_precision_takes_burns_attention() {
    let device = Device::flex();
    let shape = [2, 6, 8];
    let [q, k, v] = [1, 2, 3].map(|seed| rows(shape, seed, &device).cast(burn::tensor::DType::F16));
    let ours = causal_attention(q.clone(), k.clone(), v.clone(), 2);
    assert_eq!(ours.into_data(), burns(q, k, v, 2, true).into_data());
}
