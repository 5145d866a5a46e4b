//! ReLU, residual addition + ReLU, and GELU registered with Burn's runtime dispatch: Flex runs
//! [`flex`](crate::activation::flex)'s parallel passes, and Flex under autodiff
//! records one backward step that keeps the output (the mask's source) and hands the masked
//! gradient to every input.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Flex, backend_extension};

use crate::activation::flex;

/// Backends that run kiln's activation kernels. Call them through [`relu`](crate::relu),
/// [`add_relu`](crate::add_relu) and [`gelu`](crate::gelu), which route other backends and
/// dtypes to Burn's.
#[backend_extension(Flex, Autodiff)]
pub trait ActivationKernel: Backend {
    /// `max(x, 0)` element-wise; NaN propagates.
    fn kiln_relu(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `max(a + b, 0)` element-wise, for `a` and `b` of one shape.
    fn kiln_add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;

    /// GELU's exact form, `0.5·x·(1 + erf(x/√2))`, element-wise.
    fn kiln_gelu(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl ActivationKernel for Flex {
    fn kiln_relu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        flex::relu(x)
    }

    fn kiln_add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        flex::add_relu(a, b)
    }

    fn kiln_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        flex::gelu(x)
    }
}

/// The backward of a GELU: keeps the input (f32, contiguous).
#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    type State = FloatTensor<Flex>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        if let [Some(node)] = ops.parents {
            let input_grad = flex::gelu_backward(&ops.state, grad);
            grads.register::<Flex>(node.id, input_grad);
        }
    }
}

/// The backward of a ReLU over `N` summed inputs: the output gradient masked by the forward's
/// output, registered for each input that needs it.
#[derive(Debug)]
struct ReluBackward;

impl<const N: usize> Backward<Flex, N> for ReluBackward {
    type State = FloatTensor<Flex>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let masked = flex::relu_backward(&ops.state, grad);
        for node in ops.parents.into_iter().flatten() {
            grads.register::<Flex>(node.id, masked.clone());
        }
    }
}

impl<C: CheckpointStrategy> ActivationKernel for Autodiff<Flex, C> {
    fn kiln_relu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match ReluBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let output = flex::relu(x.into_primitive());
                prep.finish(output.clone(), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex::relu(x.into_primitive())),
        }
    }

    fn kiln_add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        match ReluBackward
            .prepare::<C>([a.node(), b.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let output = flex::add_relu(a.into_primitive(), b.into_primitive());
                prep.finish(output.clone(), output)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(flex::add_relu(a.into_primitive(), b.into_primitive()))
            }
        }
    }

    fn kiln_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match GeluBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let input = flex::readable(x.into_primitive());
                prep.finish(input.clone(), flex::gelu(input))
            }
            OpsKind::UnTracked(prep) => prep.finish(flex::gelu(x.into_primitive())),
        }
    }
}
