//! Peak memory and step time per precision on an activation-heavy model.

use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use kiln::amp::{AmpPolicy, MixedPrecision, Precision};
use kiln::core::init_module;
use kiln::data::{DataLoader, SyntheticImages};
use kiln::resnet::{ResNetConfig, StemKind};
use kiln::train::{LocalStep, Trainer};

use super::Output;
use super::workload::devices;
use crate::BenchArgs;
use crate::measure::stats;
use crate::report::{Figure, Target};

const NAME: &str = "amp";

/// (peak bytes above the steady state during training, median seconds per step).
fn measure(
    precision: Precision,
    policy: AmpPolicy,
    quick: bool,
    device: &burn::tensor::Device,
) -> Result<(usize, crate::measure::Stats), Box<dyn std::error::Error>> {
    let (batch, steps) = if quick { (32, 4) } else { (64, 8) };
    let device = device.clone().autodiff();
    // CIFAR-stem ResNet-18 keeps 32×32 maps through the first stage: activations dominate.
    let model = init_module(&device, 1, || {
        ResNetConfig::resnet18(10)
            .with_stem(StemKind::Cifar)
            .with_base_width(16)
            .init(&device)
    });
    let data = SyntheticImages::cifar_like(batch * (steps + 1), 10, 3);
    // One step to create optimizer state and warm caches, outside the measurement.
    let (model, _) = Trainer::builder(
        model,
        SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new()))
            .init(),
    )
    .gradient_step(
        LocalStep::new().with_precision(MixedPrecision::new(precision).with_policy(policy.clone())),
    )
    .train_loader(
        DataLoader::builder(data.clone())
            .batch_size(batch)
            .device(device.clone())
            .build(),
    )
    .max_steps(1)
    .progress(false)
    .log_epochs(false)
    .build()?
    .fit()?;
    let baseline = crate::live_bytes();
    crate::reset_peak();
    let (_, report) = Trainer::builder(
        model,
        SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new()))
            .init(),
    )
    .gradient_step(
        LocalStep::new().with_precision(MixedPrecision::new(precision).with_policy(policy)),
    )
    .train_loader(
        DataLoader::builder(data)
            .batch_size(batch)
            .device(device)
            .build(),
    )
    .max_steps(steps)
    .progress(false)
    .log_epochs(false)
    .build()?
    .fit()?;
    let peak = crate::peak_bytes().saturating_sub(baseline) as usize;
    let times = stats(
        report
            .steps
            .iter()
            .skip(1)
            .map(|s| batch as f64 / s.images_per_sec)
            .collect(),
    );
    Ok((peak, times))
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let device = devices(&args.devices)?.remove(0);
    let mut out = Output::default();
    let (f32_peak, f32_time) = measure(Precision::F32, AmpPolicy::default(), args.quick, &device)?;
    out.figures.push(Figure::new(
        NAME,
        "f32 peak memory above steady state",
        f32_peak as f64 / 1e6,
        "MB",
    ));
    out.figures.push(
        Figure::new(NAME, "f32 step time", f32_time.median * 1e3, "ms").spread(f32_time.spread),
    );
    // The default policy keeps batch norm in f32 (its activations are then stored in f32);
    // `cast_everything` normalises in half precision with f32 running statistics.
    let variants = [
        (Precision::Bf16, AmpPolicy::default(), "bf16"),
        (
            Precision::Bf16,
            AmpPolicy::cast_everything(),
            "bf16 (BN in bf16)",
        ),
        (Precision::F16, AmpPolicy::default(), "f16"),
        (
            Precision::F16,
            AmpPolicy::cast_everything(),
            "f16 (BN in f16)",
        ),
    ];
    for (precision, policy, label) in variants {
        let (peak, time) = measure(precision, policy, args.quick, &device)?;
        out.figures.push(Figure::new(
            NAME,
            format!("{label} peak memory above steady state"),
            peak as f64 / 1e6,
            "MB",
        ));
        let ratio = Figure::new(
            NAME,
            format!("{label} peak memory / f32"),
            peak as f64 / f32_peak.max(1) as f64,
            "ratio",
        );
        // The target is for bf16 when memory is what the user optimises for.
        out.figures.push(if label == "bf16 (BN in bf16)" {
            ratio.target(Target::AtMost(0.6))
        } else {
            ratio
        });
        out.figures.push(
            Figure::new(NAME, format!("{label} step time"), time.median * 1e3, "ms")
                .spread(time.spread),
        );
        out.figures.push(Figure::new(
            NAME,
            format!("{label} step time / f32"),
            time.median / f32_time.median,
            "ratio",
        ));
    }
    Ok(out)
}
