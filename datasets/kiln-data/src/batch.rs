//! Samples and batches.

use burn::tensor::{Int, Tensor};

/// One labelled image, channels-first, values as `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageItem {
    /// `channels × height × width` values, channel-major.
    pub pixels: Vec<f32>,
    /// `[channels, height, width]`.
    pub shape: [usize; 3],
    /// The class index.
    pub label: usize,
}

impl ImageItem {
    /// An item from 8-bit pixels scaled to `[0, 1]`.
    pub fn from_u8(pixels: &[u8], shape: [usize; 3], label: usize) -> Self {
        Self {
            pixels: pixels.iter().map(|&p| f32::from(p) / 255.0).collect(),
            shape,
            label,
        }
    }
}

/// A batch on its device, ready for a training step.
#[derive(Debug, Clone)]
pub struct ImageBatch {
    /// `[batch, channels, height, width]`.
    pub images: Tensor<4>,
    /// `[batch]` class indices.
    pub labels: Tensor<1, Int>,
    /// The data-set index of each sample, in batch order.
    pub indices: Vec<usize>,
}
