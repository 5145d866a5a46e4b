//! The model interface of kiln's image-classification trainer.

use burn::module::Module;
use burn::tensor::Tensor;

/// A model that maps a batch of images to class logits.
///
/// Implement it for your own Burn model to train it with kiln:
///
/// ```
/// use burn::module::Module;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::{Device, Tensor};
/// use kiln_core::ImageClassifier;
///
/// #[derive(Module, Debug)]
/// struct Tiny {
///     fc: Linear,
/// }
///
/// impl ImageClassifier for Tiny {
///     fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
///         self.fc.forward(images.flatten(1, 3))
///     }
/// }
///
/// let device = Device::flex();
/// let model = Tiny { fc: LinearConfig::new(3 * 4 * 4, 10).init(&device) };
/// assert_eq!(model.forward_logits(Tensor::zeros([2, 3, 4, 4], &device)).dims(), [2, 10]);
/// ```
pub trait ImageClassifier: Module {
    /// `[batch, channels, height, width]` → `[batch, classes]` logits.
    fn forward_logits(&self, images: Tensor<4>) -> Tensor<2>;
}
