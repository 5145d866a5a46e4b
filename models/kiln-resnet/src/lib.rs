//! The ResNet family (He et al., 2015) for kiln, matching torchvision's parameter counts.
//!
//! One [`ResNetConfig`] builds ResNet-18/34/50/101/152 with the ImageNet stem
//! (7×7/2 convolution + 3×3/2 max-pool) or the CIFAR stem (3×3/1, no pool), any number of
//! classes and a base width (64 in the paper) that shrinks the model for quick benchmarks.
//! [`ResNet`] implements [`kiln_core::Segmented`]: the stem, each residual block and the head
//! are its segments.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//! use kiln_resnet::{ResNetConfig, StemKind};
//!
//! let device = Device::flex();
//! let model = ResNetConfig::resnet18(10).with_stem(StemKind::Cifar).with_base_width(4).init(&device);
//! let logits = model.forward(Tensor::zeros([2, 3, 32, 32], &device));
//! assert_eq!(logits.dims(), [2, 10]);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod block;
mod config;
mod model;
mod stem;

pub use block::{BasicBlock, Bottleneck, Downsample, ResidualBlock};
pub use config::{BlockKind, ResNetConfig, StemKind};
pub use model::ResNet;
pub use stem::Stem;

#[cfg(test)]
mod tests;
