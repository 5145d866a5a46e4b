//! One optimizer step of ResNet-18 (width 64, 11 M parameters; 16 with `--quick`): Burn's `Sgd` against kiln's
//! `FusedSgd`, and Burn's `AdamW` against kiln's `FusedAdamW` (each pair the same arithmetic,
//! kiln's in one parallel pass), on one thread and on every core.

use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Distribution, Tensor};
use kiln::core::init_module;
use kiln::kernels::{FusedAdamWConfig, FusedSgdConfig};
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

/// SGD (momentum 0.9, weight decay 5e-4): Burn's and kiln's.
fn sgd_pair() -> [ModuleOptimizer; 2] {
    let momentum = || Some(MomentumConfig::new().with_momentum(0.9));
    let decay = || Some(WeightDecayConfig::new(5e-4));
    [
        SgdConfig::new()
            .with_momentum(momentum())
            .with_weight_decay(decay())
            .init(),
        FusedSgdConfig::new()
            .with_momentum(momentum())
            .with_weight_decay(decay())
            .init(),
    ]
}

/// AdamW (weight decay 0.1, the GPT's): Burn's and kiln's.
fn adamw_pair() -> [ModuleOptimizer; 2] {
    let config = FusedAdamWConfig::new().with_weight_decay(0.1);
    [config.burn().init(), config.init()]
}

/// Median seconds of one step of each optimizer of the pair, the two measured in turn after
/// a first step that creates their state; they must train alike, bit for bit.
fn measure(
    width: usize,
    reps: usize,
    device: &Device,
    mut optimizers: [ModuleOptimizer; 2],
) -> [f64; 2] {
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
        "kiln's and Burn's optimizer trained differently"
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
        for (pair, burn_name, kiln_name) in [
            (sgd_pair as fn() -> [ModuleOptimizer; 2], "Sgd", "FusedSgd"),
            (adamw_pair, "AdamW", "FusedAdamW"),
        ] {
            let [burn, fused] = pool.install(|| measure(width, reps, &device, pair()));
            for (who, seconds) in [
                (format!("Burn {burn_name}"), burn),
                (format!("kiln {kiln_name}"), fused),
            ] {
                out.figures.push(Figure::new(
                    NAME,
                    format!("w{width} step, {threads} thread(s): {who}"),
                    seconds * 1e3,
                    "ms",
                ));
            }
            out.figures.push(Figure::new(
                NAME,
                format!(
                    "w{width}, {threads} thread(s): {kiln_name} speed-up over Burn {burn_name}"
                ),
                burn / fused,
                "x",
            ));
        }
    }
    Ok(out)
}
