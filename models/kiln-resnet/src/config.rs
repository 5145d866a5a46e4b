//! The one configuration that builds every ResNet.

use burn::config::Config;
use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use crate::block::ResidualBlock;
use crate::model::ResNet;
use crate::stem::Stem;

/// Which residual block the stages are built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockKind {
    /// Two 3×3 convolutions (ResNet-18/34); expansion 1.
    Basic,
    /// 1×1 → 3×3 → 1×1 convolutions (ResNet-50/101/152); expansion 4.
    Bottleneck,
}

impl BlockKind {
    /// Output channels of a block ÷ its inner width.
    pub fn expansion(self) -> usize {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

/// The first layers, which differ between ImageNet-sized and CIFAR-sized inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StemKind {
    /// 7×7 stride-2 convolution, batch norm, ReLU, 3×3 stride-2 max-pool (224×224 inputs).
    ImageNet,
    /// 3×3 stride-1 convolution, batch norm, ReLU, no pooling (32×32 inputs).
    Cifar,
}

/// Configuration of a [`ResNet`].
#[derive(Config, Debug)]
pub struct ResNetConfig {
    /// Residual blocks in each of the four stages, e.g. `[2, 2, 2, 2]` for ResNet-18.
    pub layers: [usize; 4],
    /// The residual block type.
    pub block: BlockKind,
    /// Number of output classes.
    pub num_classes: usize,
    /// The stem.
    #[config(default = "StemKind::ImageNet")]
    pub stem: StemKind,
    /// Channels of the first stage (64 in the paper); later stages double it.
    #[config(default = 64)]
    pub base_width: usize,
    /// Input image channels.
    #[config(default = 3)]
    pub in_channels: usize,
}

impl ResNetConfig {
    /// ResNet-18: basic blocks `[2, 2, 2, 2]`.
    pub fn resnet18(num_classes: usize) -> Self {
        Self::new([2, 2, 2, 2], BlockKind::Basic, num_classes)
    }

    /// ResNet-34: basic blocks `[3, 4, 6, 3]`.
    pub fn resnet34(num_classes: usize) -> Self {
        Self::new([3, 4, 6, 3], BlockKind::Basic, num_classes)
    }

    /// ResNet-50: bottleneck blocks `[3, 4, 6, 3]`.
    pub fn resnet50(num_classes: usize) -> Self {
        Self::new([3, 4, 6, 3], BlockKind::Bottleneck, num_classes)
    }

    /// ResNet-101: bottleneck blocks `[3, 4, 23, 3]`.
    pub fn resnet101(num_classes: usize) -> Self {
        Self::new([3, 4, 23, 3], BlockKind::Bottleneck, num_classes)
    }

    /// ResNet-152: bottleneck blocks `[3, 8, 36, 3]`.
    pub fn resnet152(num_classes: usize) -> Self {
        Self::new([3, 8, 36, 3], BlockKind::Bottleneck, num_classes)
    }

    /// The configuration for a depth of 18, 34, 50, 101 or 152, if it is one of those.
    pub fn from_depth(depth: usize, num_classes: usize) -> Option<Self> {
        match depth {
            18 => Some(Self::resnet18(num_classes)),
            34 => Some(Self::resnet34(num_classes)),
            50 => Some(Self::resnet50(num_classes)),
            101 => Some(Self::resnet101(num_classes)),
            152 => Some(Self::resnet152(num_classes)),
            _ => None,
        }
    }

    /// Builds the model on `device` with torchvision's initialisation (Kaiming-normal
    /// fan-out convolutions, unit/zero batch norm).
    ///
    /// # Panics
    /// If `base_width`, `num_classes` or a stage's block count is zero.
    pub fn init(&self, device: &Device) -> ResNet {
        assert!(self.base_width > 0, "base_width must be positive");
        assert!(self.num_classes > 0, "num_classes must be positive");
        assert!(
            self.layers.iter().all(|&n| n > 0),
            "every stage needs at least one block"
        );

        let stem = Stem::new(self.stem, self.in_channels, self.base_width, device);
        let expansion = self.block.expansion();
        let mut in_channels = self.base_width;
        let mut blocks = Vec::with_capacity(self.layers.iter().sum());
        for (stage, &count) in self.layers.iter().enumerate() {
            let width = self.base_width << stage;
            for index in 0..count {
                let stride = if stage > 0 && index == 0 { 2 } else { 1 };
                blocks.push(ResidualBlock::new(
                    self.block,
                    in_channels,
                    width,
                    stride,
                    device,
                ));
                in_channels = width * expansion;
            }
        }
        let fc = burn::nn::LinearConfig::new(in_channels, self.num_classes).init(device);
        ResNet::from_parts(stem, blocks, fc)
    }
}
