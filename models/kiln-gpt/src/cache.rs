//! Generation with a key/value cache: each block keeps the keys and values of the positions
//! it has seen, so a new token costs one position's work (its query against the kept keys)
//! instead of the whole prefix again, as a full forward would.

use burn::nn::Linear;
use burn::nn::attention::generate_autoregressive_mask;
use burn::tensor::activation::{quiet_softmax, softmax};
use burn::tensor::{Int, Tensor};
use kiln_core::Segmented;

use crate::block::{Block, normed};
use crate::model::Gpt;

/// The keys and values each block has computed, `[batch, heads, positions, head width]`, for
/// [`Gpt::forward_cached`].
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<(Tensor<4>, Tensor<4>)>,
    len: usize,
}

impl KvCache {
    /// An empty cache (no position seen).
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions seen so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position has been seen.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Gpt {
    /// Logits `[batch, new, vocabulary]` of `tokens` `[batch, new]`, the positions that follow
    /// those `cache` has seen: each attends to the cached keys and values and to the new
    /// positions up to itself (as [`forward`](kiln_core::Forward::forward) does over the
    /// whole sequence), and the new keys and values join the cache. Start with
    /// [`KvCache::new`] and the prompt, then feed one token at a time.
    ///
    /// # Panics
    /// If the cache and the new tokens together pass the model's context (start a new cache
    /// with the last tokens then), or if the batch differs from the cache's.
    pub fn forward_cached(&self, tokens: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<3> {
        let [batch, new] = tokens.dims();
        let past = cache.len;
        assert!(
            past + new <= self.context(),
            "{past} cached and {new} new positions pass the model's context of {}",
            self.context()
        );
        let device = tokens.device();
        let positions = Tensor::<1, Int>::arange(past as i64..(past + new) as i64, &device)
            .reshape([1, new])
            .expand([batch, new]);
        let mut x = self.token.forward(tokens) + self.position.forward(positions);
        for (index, block) in self.blocks.iter().enumerate() {
            let kept = cache.layers.get(index).cloned();
            let (out, keys, values) = block.forward_cached(x, kept);
            match cache.layers.get_mut(index) {
                Some(slot) => *slot = (keys, values),
                None => cache.layers.push((keys, values)),
            }
            x = out;
        }
        cache.len = past + new;
        self.forward_output(x)
    }
}

impl Block {
    /// The block on the new positions `x` `[batch, new, width]`, after the cached keys and
    /// values `kept`; returns its output and every position's keys and values.
    fn forward_cached(
        &self,
        x: Tensor<3>,
        kept: Option<(Tensor<4>, Tensor<4>)>,
    ) -> (Tensor<3>, Tensor<4>, Tensor<4>) {
        let [batch, new, width] = x.dims();
        let attention = &self.attention;
        let heads = |input: Tensor<3>, linear: &Linear| {
            linear
                .forward(input)
                .reshape([batch, new, attention.n_heads, attention.d_k])
                .swap_dims(1, 2)
        };
        let normed_x = normed(&self.norm_attention, x.clone());
        let query = heads(normed_x.clone(), &attention.query);
        let (mut keys, mut values) = (
            heads(normed_x.clone(), &attention.key),
            heads(normed_x, &attention.value),
        );
        if let Some((old_keys, old_values)) = kept {
            keys = Tensor::cat(vec![old_keys, keys], 2);
            values = Tensor::cat(vec![old_values, values], 2);
        }
        let total = keys.dims()[2];
        let mut scores = query
            .matmul(keys.clone().transpose())
            .div_scalar((attention.d_k as f32).sqrt());
        if new > 1 {
            // New position i (absolute past + i) sees keys up to itself: the causal mask's
            // last `new` rows.
            let mask = generate_autoregressive_mask(batch, total, &x.device())
                .slice([0..batch, total - new..total, 0..total])
                .reshape([batch, 1, new, total]);
            scores = scores.mask_fill(mask, attention.min_float);
        }
        let weights = if attention.quiet_softmax {
            quiet_softmax(scores, 3)
        } else {
            softmax(scores, 3)
        };
        let context = weights
            .matmul(values.clone())
            .swap_dims(1, 2)
            .reshape([batch, new, width]);
        let x = x + self.dropout.forward(attention.output.forward(context));
        let hidden =
            burn::tensor::activation::gelu(self.expand.forward(normed(&self.norm_mlp, x.clone())));
        let out = x.clone() + self.dropout.forward(self.contract.forward(hidden));
        (out, keys, values)
    }
}
