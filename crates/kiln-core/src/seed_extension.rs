//! The seed of a backward pass from an intermediate tensor, registered with Burn's runtime
//! dispatch: a scalar whose backward step hands a given gradient to its input as it is.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Flex, FlexDevice, backend_extension};
use burn::tensor::FloatDType;

/// Backends that seed a backward pass from an intermediate tensor without a pass over it.
/// Call it through [`backward_from`](crate::backward_from), which routes other backends to
/// Burn's operations.
#[backend_extension(Flex, Autodiff)]
pub trait SeedKernel: Backend {
    /// A one-element zero whose backward gives `x` the gradient `upstream` (of `x`'s shape).
    fn kiln_seeded(x: FloatTensor<Self>, upstream: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// A one-element f32 zero on Flex.
fn zero() -> FloatTensor<Flex> {
    Flex::float_zeros([1].into(), &FlexDevice, FloatDType::F32)
}

impl SeedKernel for Flex {
    fn kiln_seeded(_: FloatTensor<Self>, _: FloatTensor<Self>) -> FloatTensor<Self> {
        zero()
    }
}

/// The backward of a seed: its input's gradient is the kept `upstream`, whatever reaches the
/// seed itself (Burn seeds a backward's root with ones).
#[derive(Debug)]
struct SeedBackward;

impl Backward<Flex, 1> for SeedBackward {
    type State = FloatTensor<Flex>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        drop(grads.consume::<Flex>(&ops.node));
        if let [Some(input)] = ops.parents {
            grads.register::<Flex>(input.id, ops.state);
        }
    }
}

impl<C: CheckpointStrategy> SeedKernel for Autodiff<Flex, C> {
    fn kiln_seeded(x: FloatTensor<Self>, upstream: FloatTensor<Self>) -> FloatTensor<Self> {
        match SeedBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(upstream.into_primitive(), zero()),
            OpsKind::UnTracked(prep) => prep.finish(zero()),
        }
    }
}
