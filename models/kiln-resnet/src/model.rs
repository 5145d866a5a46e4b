//! The ResNet model and its segments.

use burn::module::{Module, ModuleVisitor};
use burn::nn::Linear;
use burn::tensor::{FloatDType, Tensor};
use kiln_core::{SegmentId, Segmented};

use crate::block::ResidualBlock;
use crate::stem::Stem;

/// A residual network: stem, residual blocks, global average pool and a linear classifier.
///
/// Build it with [`ResNetConfig`](crate::ResNetConfig).
#[derive(Module, Debug)]
pub struct ResNet {
    /// The stem.
    pub stem: Stem,
    /// Every residual block of the four stages, in order.
    pub blocks: Vec<ResidualBlock>,
    /// The classifier.
    pub fc: Linear,
}

impl ResNet {
    pub(crate) fn from_parts(stem: Stem, blocks: Vec<ResidualBlock>, fc: Linear) -> Self {
        Self { stem, blocks, fc }
    }

    /// `[batch, channels, h, w]` images → `[batch, num_classes]` logits.
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = self
            .blocks
            .iter()
            .fold(self.stem.forward(images), |x, block| block.forward(x));
        self.head(x)
    }

    fn head(&self, x: Tensor<4>) -> Tensor<2> {
        // Global average pooling as a mean over the spatial axes, accumulated in f32 under
        // mixed precision, then back to the classifier's precision.
        let [batch, channels, _, _] = x.dims();
        let dtype = self.fc.weight.val().dtype();
        let pooled = x
            .cast(FloatDType::F32)
            .flatten::<3>(2, 3)
            .mean_dim(2)
            .reshape([batch, channels]);
        self.fc.forward(pooled.cast(FloatDType::from(dtype)))
    }
}

impl Segmented for ResNet {
    type Input = Tensor<4>;
    type Hidden = Tensor<4>;
    type Output = Tensor<2>;

    fn num_middle_segments(&self) -> usize {
        self.blocks.len()
    }

    fn forward_input(&self, input: Tensor<4>) -> Tensor<4> {
        self.stem.forward(input)
    }

    fn forward_middle(&self, index: usize, hidden: Tensor<4>) -> Tensor<4> {
        self.blocks[index].forward(hidden)
    }

    fn forward_output(&self, hidden: Tensor<4>) -> Tensor<2> {
        self.head(hidden)
    }

    fn visit_segment<V: ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V) {
        match segment {
            SegmentId::Input => self.stem.visit(visitor),
            SegmentId::Middle(index) => self.blocks[index].visit(visitor),
            SegmentId::Output => self.fc.visit(visitor),
        }
    }

    /// A block's input feeds its first convolution and its shortcut; nothing else forks.
    fn only_input_forks(&self) -> bool {
        true
    }
}

impl kiln_core::ImageClassifier for ResNet {
    fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
        self.forward(images)
    }
}
