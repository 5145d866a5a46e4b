//! Causal self-attention registered with Burn's runtime dispatch: Flex runs
//! [`flex`](super::flex)'s passes, and Flex under autodiff records one backward step for the
//! whole attention (scores, softmax and both products) instead of Burn's eight.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Flex, backend_extension};

use super::flex;
use crate::backward::register_parents;

/// Backends that run kiln's attention kernel. Call it through
/// [`causal_attention`](crate::causal_attention), which routes other backends and dtypes to
/// Burn's attention.
#[backend_extension(Flex, Autodiff)]
pub trait AttentionKernel: Backend {
    /// Causal self-attention of `query`, `key` and `value` rows `[batch, time, width]`
    /// split into `heads` heads of `width / heads` columns each; the heads' outputs side by
    /// side in the same layout.
    fn kiln_causal_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self>;
}

impl AttentionKernel for Flex {
    fn kiln_causal_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self> {
        flex::forward(query, key, value, heads).output
    }
}

/// The backward of one attention call: the query, key and value gradients from the saved
/// inputs, output and log-sum-exps.
#[derive(Debug)]
struct AttentionBackward;

impl Backward<Flex, 3> for AttentionBackward {
    type State = flex::Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_parents(ops, grads, flex::backward);
    }
}

impl<C: CheckpointStrategy> AttentionKernel for Autodiff<Flex, C> {
    fn kiln_causal_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self> {
        let step = AttentionBackward
            .prepare::<C>([query.node(), key.node(), value.node()])
            .compute_bound()
            .stateful();
        let (query, key, value) = (
            query.into_primitive(),
            key.into_primitive(),
            value.into_primitive(),
        );
        match step {
            OpsKind::Tracked(prep) => {
                let saved = flex::forward(query, key, value, heads);
                let output = saved.output.clone();
                prep.finish(saved, output)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex::forward(query, key, value, heads).output),
        }
    }
}
