//! The key/value cache: a prompt then one token at a time gives the logits the whole
//! sequence's forward gives, tied and untied; a cache past the context is refused.

use burn::tensor::{Device, Distribution, Int, Tensor};
use kiln_core::{Forward, init_module};

use crate::{GptConfig, KvCache};

#[test]
fn a_cached_forward_token_by_token_gives_the_whole_forward_logits() {
    let device = Device::flex();
    for config in [
        GptConfig::new(64, 12, 3, 2, 16),
        GptConfig::new(64, 12, 3, 2, 16).with_tied(false),
    ] {
        let model = init_module(&device, 5, || config.init(&device));
        let tokens = Tensor::<2, Int>::random([2, 10], Distribution::Uniform(0.0, 64.0), &device);
        let whole = model.forward(tokens.clone());
        let mut cache = KvCache::new();
        // A prompt of 4, then one token at a time.
        let mut pieces = vec![model.forward_cached(tokens.clone().slice([0..2, 0..4]), &mut cache)];
        for position in 4..10 {
            let token = tokens.clone().slice([0..2, position..position + 1]);
            pieces.push(model.forward_cached(token, &mut cache));
        }
        assert_eq!(cache.len(), 10);
        let cached = Tensor::cat(pieces, 1);
        // The same arithmetic on other shapes (one row against many): reordered sums only.
        let worst = (cached - whole.clone()).abs().max().into_scalar::<f32>();
        let scale = whole.clone().abs().max().into_scalar::<f32>();
        assert!(
            worst <= 1e-5 * scale.max(1.0),
            "{config:?}: cached logits differ by {worst} (largest {scale})"
        );
        // The control: a cache that forgot the prompt gives other logits.
        let mut fresh = KvCache::new();
        let forgot = model.forward_cached(tokens.clone().slice([0..2, 4..5]), &mut fresh);
        let moved = (forgot - whole.slice([0..2, 4..5]))
            .abs()
            .max()
            .into_scalar::<f32>();
        assert!(moved > 1e-3, "the prompt changed nothing: {moved}");
    }
}

#[test]
#[should_panic(expected = "pass the model's context of 12")]
fn a_cache_past_the_context_is_refused() {
    let device = Device::flex();
    let config = GptConfig::new(64, 12, 1, 2, 16);
    let model = init_module(&device, 5, || config.init(&device));
    let mut cache = KvCache::new();
    let tokens = Tensor::<2, Int>::zeros([1, 12], &device);
    model.forward_cached(tokens, &mut cache);
    model.forward_cached(Tensor::<2, Int>::zeros([1, 1], &device), &mut cache);
}
