//! The model's shape and behaviour: parameter counts against the closed formula (GPT-2
//! small's included), causality, the tie, and segments that reproduce the whole forward.

use burn::module::Module;
use burn::tensor::{Device, Distribution, Int, Tensor};
use kiln_core::{Forward, Segmented, init_module, param_infos};

use crate::GptConfig;

fn tiny() -> GptConfig {
    GptConfig::new(64, 12, 3, 2, 16)
}

#[test]
fn parameter_counts_follow_the_closed_formula_up_to_gpt2_small() {
    let device = Device::flex();
    for config in [
        tiny(),
        tiny().with_tied(false),
        GptConfig::new(256, 128, 4, 4, 128).with_mlp_ratio(2),
    ] {
        let model = init_module(&device, 1, || config.init(&device));
        assert_eq!(model.num_params(), config.param_count(), "{config:?}");
    }
    // GPT-2 small, counted without allocating it (Burn's parameters are lazy): the
    // published 124,439,808.
    let small = GptConfig::gpt2_small();
    assert_eq!(small.param_count(), 124_439_808);
    let model = init_module(&device, 1, || small.init(&device));
    assert_eq!(model.num_params(), 124_439_808);
}

#[test]
fn a_position_sees_only_the_tokens_before_it() {
    let device = Device::flex();
    let model = init_module(&device, 3, || tiny().init(&device));
    let tokens = Tensor::<2, Int>::random([2, 10], Distribution::Uniform(0.0, 64.0), &device);
    let logits = model.forward(tokens.clone());
    // Change the last 4 tokens: the first 6 positions' logits must not move.
    let changed = tokens
        .clone()
        .slice_assign([0..2, 6..10], Tensor::<2, Int>::zeros([2, 4], &device));
    let again = model.forward(changed);
    let before = logits.clone().slice([0..2, 0..6]);
    let after = again.clone().slice([0..2, 0..6]);
    before
        .into_data()
        .assert_approx_eq::<f32>(&after.into_data(), Default::default());
    let moved = (logits.slice([0..2, 6..10]) - again.slice([0..2, 6..10]))
        .abs()
        .max()
        .into_scalar::<f32>();
    assert!(
        moved > 1e-4,
        "the changed positions' logits moved by {moved}"
    );
}

#[test]
fn the_tied_head_is_the_token_embedding_and_segments_reproduce_the_forward() {
    let device = Device::flex().autodiff();
    let model = init_module(&device, 5, || tiny().init(&device));
    assert!(model.is_tied());
    let infos = param_infos(&model);
    assert!(
        infos.iter().all(|info| !info.path.contains("head")),
        "a tied model has no head parameter"
    );
    // Tokens below 50 only: rows 50.. of the embedding are reached through the head alone.
    let tokens = Tensor::<2, Int>::random([2, 12], Distribution::Uniform(0.0, 50.0), &device);
    let whole = model.forward(tokens.clone());
    let mut hidden = model.forward_input(tokens.clone());
    for index in 0..model.num_middle_segments() {
        hidden = model.forward_middle(index, hidden);
    }
    let pieces = model.forward_output(hidden);
    whole
        .clone()
        .into_data()
        .assert_eq(&pieces.into_data(), true);
    // The head's gradient reaches the token embedding: both uses add into one tensor.
    let grads = whole.sum().backward();
    let embedding = model
        .token
        .weight
        .grad(&grads)
        .expect("the embedding trains");
    let rows_not_in_input = embedding.slice(50..64).abs().sum().into_scalar::<f32>();
    assert!(
        rows_not_in_input > 0.0,
        "tokens never input get the head's gradient"
    );
}

#[test]
#[should_panic(expected = "longer than the model's context")]
fn a_sequence_longer_than_the_context_is_refused() {
    let device = Device::flex();
    let model = init_module(&device, 1, || tiny().init(&device));
    let tokens = Tensor::<2, Int>::zeros([1, 13], &device);
    let _ = model.forward(tokens);
}
