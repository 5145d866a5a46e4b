//! What every multi-input backward step here does with its result: compute the inputs'
//! gradients from the output's, and register each for the input that takes part.

use burn::backend::Flex;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::Ops;
use burn::backend::tensor::FloatTensor;

/// Consumes the output's gradient, then, unless no parent needs one, computes the parents'
/// gradients with `gradients(state, output_gradient)` and registers each for its parent.
pub(crate) fn register_parents<S, const N: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    gradients: impl FnOnce(&S, FloatTensor<Flex>) -> [FloatTensor<Flex>; N],
) {
    let grad = grads.consume::<Flex>(&ops.node);
    if ops.parents.iter().all(Option::is_none) {
        return;
    }
    let computed = gradients(&ops.state, grad);
    for (node, gradient) in ops.parents.into_iter().zip(computed) {
        if let Some(node) = node {
            grads.register::<Flex>(node.id, gradient);
        }
    }
}
