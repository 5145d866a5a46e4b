//! The training workload every training benchmark shares: the example's model and data.

use kiln::core::init_module;
use kiln::data::SyntheticImages;
use kiln::resnet::{ResNet, ResNetConfig, StemKind};

use burn::tensor::Device;

/// Per-replica batch size.
pub const BATCH: usize = 32;

/// ResNet-18, base width 8, CIFAR stem: the `resnet_ddp` example's default model.
pub fn model(device: &Device) -> ResNet {
    model_of_width(device, 8)
}

/// ResNet-18 with the CIFAR stem and base width `width`.
pub fn model_of_width(device: &Device, width: usize) -> ResNet {
    resnet_of(device, 18, width)
}

/// ResNet-`depth` (18, 34, 50, 101, 152) with the CIFAR stem and base width `width`.
///
/// # Panics
/// For another depth.
pub fn resnet_of(device: &Device, depth: usize, width: usize) -> ResNet {
    init_module(device, 42, || {
        ResNetConfig::from_depth(depth, 10)
            .expect("a ResNet depth")
            .with_stem(StemKind::Cifar)
            .with_base_width(width)
            .init(device)
    })
}

/// CIFAR-shaped synthetic data.
pub fn data(len: usize) -> SyntheticImages {
    SyntheticImages::cifar_like(len, 10, 42)
}

/// Steps (warm-up, measured) for the run's size.
pub fn steps(quick: bool) -> (usize, usize) {
    if quick { (2, 6) } else { (4, 24) }
}

/// Median seconds per step over the measured steps of a report.
pub fn median_step_seconds(
    report: &kiln::train::TrainReport,
    warmup: usize,
) -> crate::measure::Stats {
    crate::measure::stats(
        report.steps[warmup..]
            .iter()
            .map(|s| BATCH as f64 / s.images_per_sec)
            .collect(),
    )
}

/// The devices named by `--devices` (`cpu` by default); replicas cycle over them.
pub fn devices(spec: &str) -> Result<Vec<Device>, Box<dyn std::error::Error>> {
    let specs = kiln::core::DeviceSpec::parse_list(spec)?;
    Ok(specs.iter().map(|s| s.device()).collect::<Result<_, _>>()?)
}

/// `replicas` devices, cycling over `devices`.
pub fn replica_devices(devices: &[Device], replicas: usize) -> Vec<Device> {
    (0..replicas)
        .map(|i| devices[i % devices.len()].clone())
        .collect()
}

/// SGD with momentum 0.9 (Burn's `Sgd` arithmetic in kiln's one-pass kernel): the optimizer
/// every training benchmark uses.
pub fn optimizer() -> burn::optim::ModuleOptimizer {
    kiln::kernels::FusedSgdConfig::new()
        .with_momentum(Some(
            burn::optim::momentum::MomentumConfig::new().with_momentum(0.9),
        ))
        .init()
}
