//! What the pipeline's run tests share: a small seeded ResNet, SGD with momentum, a shuffled
//! synthetic loader, parameters by path and the relative error of parameter changes.

use std::collections::HashMap;

use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::Device;
use kiln_amp::MixedPrecision;
use kiln_core::{ImageClassifier, init_on_host};
use kiln_data::{DataLoader, SyntheticImages};
use kiln_resnet::{ResNet, ResNetConfig, StemKind};
use kiln_train::{GradientStep, LocalStep, LrSchedule, TrainReport, Trainer, TrainerBuilder};

/// ResNet-18 of base width 2 (CIFAR stem, 4 classes), seeded, built on the CPU and forked
/// to `device` (the same weights on every device kind).
pub(crate) fn resnet(device: &Device, seed: u64) -> ResNet {
    init_on_host(device, seed, |device| {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(2)
            .init(device)
    })
}

/// SGD with momentum 0.9.
pub(crate) fn sgd() -> burn::optim::ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}

/// 96 synthetic 8×8 images, shuffled, whole batches of `batch`, on the training device.
pub(crate) fn shuffled(batch: usize) -> DataLoader {
    shuffled_on(&Device::flex().autodiff(), batch)
}

/// [`shuffled`]'s batches on `device`.
pub(crate) fn shuffled_on(device: &Device, batch: usize) -> DataLoader {
    DataLoader::builder(SyntheticImages::new(96, 4, 3, [3, 8, 8]))
        .batch_size(batch)
        .shuffle(2)
        .drop_last(true)
        .device(device.clone())
        .build()
}

/// The one-device reference of a pipeline: `model` (on the training device `device`)
/// trained with [`sgd`] at learning rate `lr` in `precision` for `steps` steps, each
/// accumulating `micro` micro-batches of `size` samples of [`shuffled_on`]; its trainable
/// parameters by path.
pub(crate) fn accumulating_on<M: ImageClassifier>(
    device: &Device,
    model: M,
    (size, micro): (usize, usize),
    lr: f64,
    precision: MixedPrecision,
    steps: usize,
) -> HashMap<String, Vec<f32>> {
    let (model, _) = fit_quietly(
        Trainer::builder(model, sgd())
            .gradient_step(LocalStep::new().with_precision(precision))
            .schedule(LrSchedule::constant(lr))
            .train_loader(shuffled_on(device, size))
            .accumulation_steps(micro)
            .max_steps(steps),
    );
    by_path(&model)
}

/// Runs the one-device reference `builder` describes, quietly: the model and the report.
pub(crate) fn fit_quietly<M, S>(builder: TrainerBuilder<M, S>) -> (M, TrainReport)
where
    M: ImageClassifier,
    S: GradientStep<M>,
{
    builder
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap()
        .fit()
        .unwrap()
}

/// Trainable parameters by path (kiln-train's test helper).
pub(crate) use kiln_train::testing::by_path;
