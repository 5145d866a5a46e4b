//! The stem: the layers before the first residual block.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, PaddingConfig2d};
use burn::tensor::{Device, Tensor};
use kiln_kernels::conv2d;
use kiln_kernels::relu;

use crate::StemKind;
use crate::block::conv_initializer;

/// Convolution, batch norm, ReLU and (ImageNet stem only) max-pool.
#[derive(Module, Debug)]
pub struct Stem {
    /// The first convolution (no bias: batch norm follows).
    pub conv: Conv2d,
    /// Its batch norm.
    pub bn: BatchNorm,
    /// The ImageNet stem's 3×3/2 max-pool.
    pub pool: Option<MaxPool2d>,
}

impl Stem {
    /// Builds a stem of `kind` from `in_channels` to `width` channels.
    pub fn new(kind: StemKind, in_channels: usize, width: usize, device: &Device) -> Self {
        let (kernel, stride, padding) = match kind {
            StemKind::ImageNet => (7, 2, 3),
            StemKind::Cifar => (3, 1, 1),
        };
        let conv = Conv2dConfig::new([in_channels, width], [kernel, kernel])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(
                padding, padding, padding, padding,
            ))
            .with_bias(false)
            .with_initializer(conv_initializer())
            .init(device);
        let pool = (kind == StemKind::ImageNet).then(|| {
            MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init()
        });
        Self {
            conv,
            bn: BatchNormConfig::new(width).init(device),
            pool,
        }
    }

    /// `[batch, in_channels, h, w]` → `[batch, width, h', w']`.
    pub fn forward(&self, input: Tensor<4>) -> Tensor<4> {
        let x = relu(crate::block::norm(&self.bn, conv2d(&self.conv, input)));
        match &self.pool {
            Some(pool) => pool.forward(x),
            None => x,
        }
    }
}
