//! The self-test's model, data and optimizer: a small convolutional classifier that trains
//! in milliseconds on any device and has both convolution and linear parameters.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use kiln_core::{ImageClassifier, init_module};
use kiln_data::SyntheticImages;

/// Two 3×3 convolutions (the second residual) and a linear head over pooled features.
#[derive(Module, Debug)]
pub(super) struct Probe {
    stem: Conv2d,
    body: Conv2d,
    head: Linear,
}

impl Probe {
    /// The same parameters on every device (seed 11).
    pub(super) fn new(device: &Device) -> Self {
        let conv = |i, o| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        init_module(device, 11, || Self {
            stem: conv(3, 8),
            body: conv(8, 8),
            head: LinearConfig::new(8, 4).init(device),
        })
    }
}

impl ImageClassifier for Probe {
    fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
        let x = relu(self.stem.forward(images));
        let x = relu(self.body.forward(x.clone())) + x;
        let [batch, channels, _, _] = x.dims();
        self.head
            .forward(x.flatten::<3>(2, 3).mean_dim(2).reshape([batch, channels]))
    }
}

/// 240 synthetic 6×6 images of 4 classes.
pub(super) fn data() -> SyntheticImages {
    SyntheticImages::new(240, 4, 3, [3, 6, 6])
}

/// SGD with momentum 0.9: the update carries state, so a wrong step compounds.
pub(super) fn optimizer() -> burn::optim::ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}
