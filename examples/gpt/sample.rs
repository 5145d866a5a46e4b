//! Writing with the trained model: top-k sampling, byte after byte, and the trained
//! parameters of a pipeline put back into one model.

use std::collections::HashMap;

use burn::tensor::{Device, Int, Tensor, TensorData};
use kiln::core::{FlatLayout, param_infos, write_params};
use kiln::gpt::{Gpt, KvCache};

/// Top-k sampling's k.
const TOP_K: usize = 5;

/// `model` with the parameters of `params` (by path, as a pipeline reports its trained
/// ones); an error names a path the model lacks.
pub fn with_params(model: Gpt, params: &HashMap<String, Vec<f32>>) -> Result<Gpt, String> {
    // By path, not by the `trainable` flag: a model built for inference may not mark them.
    let layout = FlatLayout::new(
        param_infos(&model)
            .into_iter()
            .filter(|info| params.contains_key(&info.path)),
    );
    if layout.entries().len() != params.len() {
        let missing: Vec<&String> = params
            .keys()
            .filter(|path| layout.entries().iter().all(|e| &e.info.path != *path))
            .collect();
        return Err(format!(
            "the model lacks the trained parameters {missing:?}"
        ));
    }
    let flat: Vec<f32> = layout
        .entries()
        .iter()
        .flat_map(|entry| params[&entry.info.path].iter().copied())
        .collect();
    Ok(write_params(model, &layout, &flat))
}

/// `count` bytes after `prompt`, each drawn from the model's `TOP_K` likeliest (seeded). The
/// model keeps each position's keys and values (`KvCache`): a byte costs one position's
/// work. When the cache holds the whole `context`, it starts again from the last half of
/// it (the model then sees at least `context / 2` bytes back).
pub fn generate(model: &Gpt, prompt: &[u8], count: usize, context: usize, seed: u64) -> Vec<u8> {
    let device = Device::flex();
    let mut text = prompt.to_vec();
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut cache = KvCache::new();
    // What the cache has not seen yet: the prompt's last `context` bytes at first.
    let mut unseen = text[text.len().saturating_sub(context)..].to_vec();
    for _ in 0..count {
        if cache.len() + unseen.len() > context {
            cache = KvCache::new();
            unseen = text[text.len().saturating_sub(context / 2)..].to_vec();
        }
        let ids: Vec<i64> = unseen.iter().map(|&b| i64::from(b)).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, unseen.len()]), &device);
        let logits = model.forward_cached(tokens, &mut cache);
        let [_, time, vocabulary] = logits.dims();
        let last: Vec<f32> = logits
            .slice([0..1, time - 1..time])
            .reshape([vocabulary])
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32 logits");
        let mut order: Vec<usize> = (0..vocabulary).collect();
        order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
        let top = &order[..TOP_K];
        let best = last[top[0]];
        let weights: Vec<f64> = top
            .iter()
            .map(|&t| f64::from(last[t] - best).exp())
            .collect();
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut pick = (state >> 11) as f64 / (1u64 << 53) as f64 * weights.iter().sum::<f64>();
        let mut chosen = top[0];
        for (&token, weight) in top.iter().zip(&weights) {
            if pick < *weight {
                chosen = token;
                break;
            }
            pick -= weight;
        }
        text.push(chosen as u8);
        unseen = vec![chosen as u8];
    }
    text
}
