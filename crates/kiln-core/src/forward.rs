//! The model interface of kiln's training steps, for any input and output.

use burn::module::Module;
use burn::tensor::Tensor;

use crate::ImageClassifier;

/// A model kiln can train: a forward pass from [`Input`](Self::Input) to
/// [`Output`](Self::Output).
///
/// Whole-model steps (`kiln_train::LocalStep`, `kiln_ddp::Replica::non_overlapped_step`)
/// call [`forward`](Self::forward); what the output is scored against is the objective's
/// business (`kiln_train::Objective`), so the model need not be a classifier. Every
/// [`ImageClassifier`] is one (`Tensor<4>` images → `Tensor<2>` logits). A
/// [`Segmented`](crate::Segmented) model implements it by running its segments
/// ([`forward_segments`](crate::forward_segments)):
///
/// ```
/// use burn::module::Module;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::{Device, Tensor};
/// use kiln_core::Forward;
///
/// #[derive(Module, Debug)]
/// struct Regressor {
///     fc: Linear,
/// }
///
/// impl Forward for Regressor {
///     type Input = Tensor<2>;
///     type Output = Tensor<2>;
///     fn forward(&self, input: Tensor<2>) -> Tensor<2> {
///         self.fc.forward(input)
///     }
/// }
///
/// let device = Device::flex();
/// let model = Regressor { fc: LinearConfig::new(3, 1).init(&device) };
/// assert_eq!(Forward::forward(&model, Tensor::zeros([4, 3], &device)).dims(), [4, 1]);
/// ```
pub trait Forward: Module {
    /// What the model takes (e.g. a batch of images).
    type Input;
    /// What the model gives (e.g. logits).
    type Output;

    /// Runs the model on `input`.
    fn forward(&self, input: Self::Input) -> Self::Output;
}

/// An image classifier's forward is its logits.
impl<M: ImageClassifier> Forward for M {
    type Input = Tensor<4>;
    type Output = Tensor<2>;

    fn forward(&self, input: Tensor<4>) -> Tensor<2> {
        self.forward_logits(input)
    }
}
