//! Layer norm registered with Burn's runtime dispatch: Flex runs [`flex`](super::flex)'s
//! passes, and Flex under autodiff records one backward step for the whole normalisation.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Flex, backend_extension};

use super::flex;
use crate::backward::register_parents;

/// Backends that run kiln's layer-norm kernel. Call it through
/// [`layer_norm`](crate::layer_norm), which routes other backends and dtypes to Burn's.
#[backend_extension(Flex, Autodiff)]
pub trait LayerNormKernel: Backend {
    /// `input` normalised over its last dimension (biased variance), scaled by `gamma` and
    /// shifted by `beta` (both of the last dimension's size).
    fn kiln_layer_norm(
        input: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self>;
}

impl LayerNormKernel for Flex {
    fn kiln_layer_norm(
        input: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        flex::forward(input, gamma, beta, epsilon).0
    }
}

/// The backward of one layer norm: input, scale and shift gradients.
#[derive(Debug)]
struct LayerNormBackward;

impl Backward<Flex, 3> for LayerNormBackward {
    type State = flex::Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_parents(ops, grads, flex::backward);
    }
}

impl<C: CheckpointStrategy> LayerNormKernel for Autodiff<Flex, C> {
    fn kiln_layer_norm(
        input: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let step = LayerNormBackward
            .prepare::<C>([input.node(), gamma.node(), beta.node()])
            .compute_bound()
            .stateful();
        let (input, gamma, beta) = (
            input.into_primitive(),
            gamma.into_primitive(),
            beta.into_primitive(),
        );
        match step {
            OpsKind::Tracked(prep) => {
                let (output, saved) = flex::forward(input, gamma, beta, epsilon);
                prep.finish(saved, output)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex::forward(input, gamma, beta, epsilon).0),
        }
    }
}
