//! `resnet_ddp selftest`: kiln's data-parallel and mixed-precision equivalence checks, run on
//! the devices `--devices` names, through the public API only — so a GPU node checks them
//! from the bundle without a Rust toolchain (`--devices cuda:0,cuda:0`, or one entry per GPU),
//! and CI checks the same code on CPU devices.
//!
//! Each check trains a small convolutional classifier for a few SGD-momentum steps and
//! compares every parameter's *change* with a reference run (relative to the largest change
//! of that tensor): replicas against one device on the union batch, with a control —
//! unsynchronised replicas — that must miss by far.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use kiln::amp::{MixedPrecision, Precision};
use kiln::core::{DeviceSpec, FlatLayout, ImageClassifier, init_module, param_infos, read_params};
use kiln::data::{DataLoader, SyntheticImages};
use kiln::ddp::{DataParallel, DdpConfig, GradientPath, SyncMode};
use kiln::train::{LocalStep, LrSchedule, Trainer};

/// Steps per run.
const STEPS: usize = 5;
/// Samples per replica per step.
const BATCH: usize = 4;
/// f32: replicas against one device, in another reduction order and on a GPU in TF32 tiles.
const F32_TOLERANCE: f32 = kiln_test_support::tolerance::TF32;
/// Half precision: each replica rounds its own half batch.
const HALF_TOLERANCE: f32 = kiln_test_support::tolerance::HALF_PRECISION;

#[derive(Module, Debug)]
struct Probe {
    stem: Conv2d,
    body: Conv2d,
    head: Linear,
}

impl Probe {
    fn new(device: &Device) -> Self {
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
        let x = relu(kiln::kernels::conv2d(&self.stem, images));
        let x = relu(kiln::kernels::conv2d(&self.body, x.clone())) + x;
        let [batch, channels, _, _] = x.dims();
        self.head
            .forward(x.flatten::<3>(2, 3).mean_dim(2).reshape([batch, channels]))
    }
}

fn data() -> SyntheticImages {
    SyntheticImages::new(240, 4, 3, [3, 6, 6])
}

fn optimizer() -> burn::optim::ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}

fn params<M: Module>(model: &M) -> Vec<f32> {
    read_params(model, &FlatLayout::new(param_infos(model)))
}

/// One device, `batch` samples per step: (start, end) parameters.
fn single(
    device: &Device,
    batch: usize,
    precision: Precision,
) -> Result<(Vec<f32>, Vec<f32>), String> {
    let device = device.clone().autodiff();
    let model = Probe::new(&device);
    let start = params(&model);
    let loader = DataLoader::builder(data())
        .batch_size(batch)
        .shuffle(4)
        .device(device.clone())
        .build();
    let (model, _) = Trainer::builder(model, optimizer())
        .gradient_step(LocalStep::new().with_precision(MixedPrecision::new(precision)))
        .schedule(LrSchedule::constant(0.2))
        .train_loader(loader)
        .max_steps(STEPS)
        .progress(false)
        .log_epochs(false)
        .build()
        .map_err(|e| e.to_string())?
        .fit()
        .map_err(|e| e.to_string())?;
    Ok((start, params(&model)))
}

/// One replica per device: every replica's end parameters.
fn replicated(devices: &[Device], config: DdpConfig) -> Result<Vec<Vec<f32>>, String> {
    DataParallel::new(devices.to_vec())
        .config(config)
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(Probe::new(&device))?;
            let loader = DataLoader::builder(data())
                .batch_size(BATCH)
                .shuffle(4)
                .shard(replica.rank(), replica.world_size())
                .device(device)
                .build();
            let (model, _) = Trainer::builder(model, optimizer())
                .gradient_step(replica.non_overlapped_step())
                .schedule(LrSchedule::constant(0.2))
                .train_loader(loader)
                .max_steps(STEPS)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            Ok(params(&model))
        })
        .map_err(|e| e.to_string())
}

/// The worst relative error of the replicas' parameter changes against the reference's
/// (kiln's one metric, the whole model as one tensor); an error when the reference did not
/// move, since nothing could then be compared.
fn change_error(replicas: &[Vec<f32>], start: &[f32], reference: &[f32]) -> Result<f32, String> {
    if reference == start {
        return Err("the one-device reference did not move: nothing to compare".into());
    }
    let copies: Vec<&[f32]> = replicas.iter().map(Vec::as_slice).collect();
    Ok(kiln_test_support::worst_change(start, reference, &copies).error)
}

/// Replicas on `devices` in `precision` against one device on the union batch; with two or
/// more replicas, the unsynchronised control must miss. A line per check.
fn equivalence(
    devices: &[Device],
    precision: Precision,
    tolerance: f32,
) -> Vec<(String, Result<String, String>)> {
    let mut lines = Vec::new();
    let reference = match single(&devices[0], BATCH * devices.len(), precision) {
        Ok(reference) => reference,
        Err(err) => return vec![(format!("{precision:?} reference"), Err(err))],
    };
    let base = DdpConfig {
        precision: MixedPrecision::new(precision),
        ..DdpConfig::default()
    };
    for path in [GradientPath::Host, GradientPath::Device] {
        let what = format!("{precision:?}, {} replica(s), {path:?} path", devices.len());
        let config = DdpConfig {
            gradient_path: path,
            ..base.clone()
        };
        let result = replicated(devices, config).and_then(|got| {
            let error = change_error(&got, &reference.0, &reference.1)?;
            if error <= tolerance {
                Ok(format!("change error {error:.1e} ≤ {tolerance:.0e}"))
            } else {
                Err(format!("change error {error:.1e} > {tolerance:.0e}"))
            }
        });
        lines.push((what, result));
    }
    if devices.len() > 1 {
        let config = DdpConfig {
            mode: SyncMode::Unsynchronized,
            ..base
        };
        let result = replicated(devices, config).and_then(|got| {
            let error = change_error(&got, &reference.0, &reference.1)?;
            if error > 4.0 * tolerance {
                Ok(format!("control misses as it must: {error:.1e}"))
            } else {
                Err(format!(
                    "the unsynchronised control passed ({error:.1e}): the check cannot fail"
                ))
            }
        });
        lines.push((format!("{precision:?}, unsynchronised control"), result));
    }
    lines
}

/// Runs every check on `--devices`; prints a line each; whether all passed.
pub fn run(devices: &str) -> bool {
    let opened = DeviceSpec::parse_list(devices)
        .map_err(|e| e.to_string())
        .and_then(|specs| {
            let devices = specs
                .iter()
                .map(|s| s.device().map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((specs, devices))
        });
    let (specs, devices) = match opened {
        Ok(opened) => opened,
        Err(err) => {
            println!("selftest: {err}");
            return false;
        }
    };
    // Half precision: bf16, except on wgpu (lavapipe and many GPUs there have f16 only).
    let half = if specs[0] == DeviceSpec::Wgpu {
        Precision::F16
    } else {
        Precision::Bf16
    };
    let start = std::time::Instant::now();
    let mut passed = true;
    for (precision, tolerance) in [(Precision::F32, F32_TOLERANCE), (half, HALF_TOLERANCE)] {
        for (what, result) in equivalence(&devices, precision, tolerance) {
            match result {
                Ok(detail) => println!("selftest: ok    {what}: {detail}"),
                Err(detail) => {
                    passed = false;
                    println!("selftest: FAIL  {what}: {detail}");
                }
            }
        }
    }
    let elapsed = start.elapsed();
    println!(
        "selftest: {} in {:.1} s",
        if passed { "passed" } else { "FAILED" },
        elapsed.as_secs_f64()
    );
    passed
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_selftest_passes_on_cpu_replicas_and_refuses_a_missing_device() {
        assert!(super::run("cpu:0,cpu:1"));
        if !cfg!(feature = "cuda") {
            assert!(!super::run("cuda:0"));
        }
    }
}
