//! Batch norm registered with Burn's runtime dispatch. Training mode: Flex runs
//! [`flex`](crate::batch_norm::flex)'s passes, and Flex under autodiff records one
//! backward step for the whole normalisation (statistics included). Inference mode (running
//! statistics): Flex runs one parallel pass; under autodiff, Burn's own composition.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::ModuleOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, AutodiffBackend, Backend, Flex, backend_extension};
use burn::tensor::DType;

use crate::batch_norm::flex;

/// Backends that run kiln's batch-norm kernel. Call it through
/// [`batch_norm_train`](crate::batch_norm_train), which routes other backends to Burn's.
#[backend_extension(Flex, Autodiff)]
pub trait BatchNormKernel: Backend {
    /// `x` `[N, C, H, W]` normalised with its own per-channel statistics, scaled by `gamma`
    /// and shifted by `beta`: `(output, mean, biased variance)`. Only the output carries a
    /// gradient.
    fn kiln_batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `x` `[N, C, H, W]` normalised with the given per-channel `mean` and `variance`
    /// (inference mode), scaled by `gamma` and shifted by `beta`.
    fn kiln_batch_norm_inference(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        variance: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self>;
}

impl BatchNormKernel for Flex {
    fn kiln_batch_norm_inference(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        variance: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        flex::inference(x, (gamma, beta), (mean, variance), epsilon)
    }

    fn kiln_batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let normalized = flex::forward(x, gamma, beta, epsilon);
        (normalized.output, normalized.mean, normalized.variance)
    }
}

/// The state the backward step needs: the input and gamma (as graph nodes), the batch's
/// statistics in f32, epsilon and beta's dtype.
type NormState = (
    NodeId,
    NodeId,
    (FloatTensor<Flex>, FloatTensor<Flex>),
    f64,
    DType,
);

#[derive(Debug)]
struct NormBackward;

impl Backward<Flex, 3> for NormBackward {
    type State = NormState;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x_state, gamma_state, statistics, epsilon, beta_dtype) = ops.state;
        let x: FloatTensor<Flex> = checkpointer.retrieve_node_output(x_state);
        let gamma: FloatTensor<Flex> = checkpointer.retrieve_node_output(gamma_state);
        let (x_grad, gamma_grad, beta_grad) =
            flex::backward(x, gamma, statistics, epsilon, grad, beta_dtype);
        for (node, grad) in [
            (node_x, x_grad),
            (node_gamma, gamma_grad),
            (node_beta, beta_grad),
        ] {
            if let Some(node) = node {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

impl<C: CheckpointStrategy> BatchNormKernel for Autodiff<Flex, C> {
    /// Under autodiff, Burn's composition (tracked like any other tensor operations): a
    /// frozen layer fine-tuned on the training device gets its gradients from it.
    fn kiln_batch_norm_inference(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        variance: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        <Self as ModuleOps<Self>>::batch_norm(x, gamma, beta, mean, variance, epsilon)
    }

    fn kiln_batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let constant = <Self as AutodiffBackend>::from_inner;
        let forward = |x: FloatTensor<Self>, gamma: FloatTensor<Self>, beta: FloatTensor<Self>| {
            let (x, gamma, beta) = (
                x.into_primitive(),
                gamma.into_primitive(),
                beta.into_primitive(),
            );
            flex::forward(x, gamma, beta, epsilon)
        };
        match NormBackward
            .prepare::<C>([x.node(), gamma.node(), beta.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_state = prep.checkpoint(&x);
                let gamma_state = prep.checkpoint(&gamma);
                let beta_dtype = beta.primitive().dtype();
                let normalized = forward(x, gamma, beta);
                let statistics = (normalized.saved_mean, normalized.saved_variance);
                let state = (x_state, gamma_state, statistics, epsilon, beta_dtype);
                (
                    prep.finish(state, normalized.output),
                    constant(normalized.mean),
                    constant(normalized.variance),
                )
            }
            OpsKind::UnTracked(prep) => {
                let normalized = forward(x, gamma, beta);
                (
                    prep.finish(normalized.output),
                    constant(normalized.mean),
                    constant(normalized.variance),
                )
            }
        }
    }
}
