//! The convolution registered with Burn's runtime dispatch (a backend extension): the Flex
//! backend runs [`flex::forward`](crate::conv::flex), and Flex under autodiff records a
//! backward step that runs [`flex::backward`](crate::conv::flex) — im2col and GEMMs (plus
//! a col2im for strided convolutions) — instead of Burn's transposed and dilated convolutions.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Flex, backend_extension};

use crate::conv::flex;
use crate::conv::geometry::ConvGeometry;

/// Backends that run kiln's im2col + GEMM convolution. Call it through
/// [`conv2d`](crate::conv::entry), which routes other backends to Burn's convolution.
#[backend_extension(Flex, Autodiff)]
pub trait ConvKernel: Backend {
    /// `x` `[N, Cin, H, W]` convolved with `weight` `[Cout, Cin, kh, kw]`, no bias, no groups.
    fn kiln_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geometry: ConvGeometry,
    ) -> FloatTensor<Self>;
}

impl ConvKernel for Flex {
    fn kiln_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geometry: ConvGeometry,
    ) -> FloatTensor<Self> {
        flex::forward(x, weight, geometry)
    }
}

/// The backward step: the input and weight gradients from the saved input and weight.
#[derive(Debug)]
struct ConvBackward;

impl Backward<Flex, 2> for ConvBackward {
    type State = (NodeId, NodeId, ConvGeometry);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_x, node_weight] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x_state, weight_state, geometry) = ops.state;
        let x: FloatTensor<Flex> = checkpointer.retrieve_node_output(x_state);
        let weight: FloatTensor<Flex> = checkpointer.retrieve_node_output(weight_state);
        let (input_grad, weight_grad) = flex::backward(
            x,
            weight,
            grad,
            geometry,
            node_x.is_some(),
            node_weight.is_some(),
        );
        if let (Some(node), Some(grad)) = (node_x, input_grad) {
            grads.register::<Flex>(node.id, grad);
        }
        if let (Some(node), Some(grad)) = (node_weight, weight_grad) {
            grads.register::<Flex>(node.id, grad);
        }
    }
}

impl<C: CheckpointStrategy> ConvKernel for Autodiff<Flex, C> {
    fn kiln_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geometry: ConvGeometry,
    ) -> FloatTensor<Self> {
        match ConvBackward
            .prepare::<C>([x.node(), weight.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_state = prep.checkpoint(&x);
                let weight_state = prep.checkpoint(&weight);
                let output = flex::forward(x.into_primitive(), weight.into_primitive(), geometry);
                prep.finish((x_state, weight_state, geometry), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex::forward(
                x.into_primitive(),
                weight.into_primitive(),
                geometry,
            )),
        }
    }
}
