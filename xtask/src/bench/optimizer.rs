//! One optimizer step of ResNet-18 (width 64, 11 M parameters; 16 with `--quick`): Burn's `Sgd` against kiln's
//! `FusedSgd` (the same arithmetic in one parallel pass), on one thread and on every core.

use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Distribution, Tensor};
use kiln::core::init_module;
use kiln::kernels::FusedSgdConfig;
use kiln::resnet::{ResNet, ResNetConfig, StemKind};

use super::Output;
use super::throughput::cores;
use super::workload::devices;
use crate::BenchArgs;
use crate::measure::stats;
use crate::report::Figure;

const NAME: &str = "optimizer";

fn model(device: &Device, width: usize) -> ResNet {
    init_module(device, 1, || {
        ResNetConfig::resnet18(10)
            .with_stem(StemKind::Cifar)
            .with_base_width(width)
            .init(device)
    })
}

/// Real gradients of `model` (a batch of two images drawn from `seed`).
fn gradients(model: &ResNet, device: &Device, seed: u64) -> GradientsParams {
    let x = init_module(device, seed, || {
        Tensor::<4>::random([2, 3, 32, 32], Distribution::Default, device)
    });
    let loss = model.forward(x).powi_scalar(2).mean();
    GradientsParams::from_grads(loss.backward(), model)
}

/// Median seconds of one step of each optimizer (momentum 0.9, weight decay 5e-4), the two
/// measured in turn after a first step that creates their state.
fn measure(width: usize, reps: usize, device: &Device) -> [f64; 2] {
    let momentum = || Some(MomentumConfig::new().with_momentum(0.9));
    let decay = || Some(WeightDecayConfig::new(5e-4));
    let mut optimizers: [ModuleOptimizer; 2] = [
        SgdConfig::new()
            .with_momentum(momentum())
            .with_weight_decay(decay())
            .init(),
        FusedSgdConfig::new()
            .with_momentum(momentum())
            .with_weight_decay(decay())
            .init(),
    ];
    let mut models = [model(device, width), model(device, width)];
    let mut samples = [Vec::new(), Vec::new()];
    for rep in 0..=reps {
        for k in 0..2 {
            let grads = gradients(&models[k], device, rep as u64);
            let start = std::time::Instant::now();
            let stepped = optimizers[k].step(0.05, models[k].clone(), grads);
            let seconds = start.elapsed().as_secs_f64();
            models[k] = stepped;
            if rep > 0 {
                samples[k].push(seconds);
            }
        }
    }
    assert_eq!(
        kiln::core::fingerprint(&models[0]),
        kiln::core::fingerprint(&models[1]),
        "FusedSgd and Sgd trained differently"
    );
    samples.map(|s| stats(s).median)
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let device = devices(&args.devices)?[0].clone().autodiff();
    let reps = if args.quick { 3 } else { 9 };
    // Width 64 is the peer table's large model; the quick (CI) run takes width 16.
    let width = if args.quick { 16 } else { 64 };
    let mut counts = vec![1, cores()];
    counts.dedup();
    for threads in counts {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        let [burn, fused] = pool.install(|| measure(width, reps, &device));
        for (who, seconds) in [("Burn Sgd", burn), ("kiln FusedSgd", fused)] {
            out.figures.push(Figure::new(
                NAME,
                format!("w{width} step, {threads} thread(s): {who}"),
                seconds * 1e3,
                "ms",
            ));
        }
        out.figures.push(Figure::new(
            NAME,
            format!("w{width}, {threads} thread(s): FusedSgd speed-up over Burn Sgd"),
            burn / fused,
            "x",
        ));
    }
    Ok(out)
}
