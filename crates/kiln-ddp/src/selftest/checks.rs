//! The checks: replicas on the given devices train like one device on the union batch (each
//! parameter's *change* compared, kiln's one metric), in f32 and in half precision, on both
//! gradient paths, and an unsynchronised control that must miss.

use std::time::Instant;

use burn::module::Module;
use burn::tensor::Device;
use kiln_amp::{MixedPrecision, Precision};
use kiln_core::{FlatLayout, param_infos, read_params};
use kiln_data::DataLoader;
use kiln_test_support::tolerance;
use kiln_train::{LocalStep, LrSchedule, Trainer};

use super::probe::{Probe, data, optimizer};
use super::{SelfTestCheck, SelfTestReport};
use crate::{DataParallel, DdpConfig, DdpError, GradientPath, SyncMode};

/// Steps per run.
const STEPS: usize = 5;
/// Samples per replica per step.
const BATCH: usize = 4;
/// f32: replicas against one device, in another reduction order and on a GPU in TF32 tiles.
const F32_TOLERANCE: f32 = tolerance::TF32;
/// Half precision: each replica rounds its own half batch.
const HALF_TOLERANCE: f32 = tolerance::HALF_PRECISION;
/// The control must miss by this multiple of the tolerance at least.
const CONTROL_MARGIN: f32 = 4.0;

/// kiln's data-parallel equivalence checks on the devices a user trains on: a small
/// classifier trained for a few SGD-momentum steps by one replica per device, against one
/// device on the union batch, in f32 and in half precision, on the host and the device
/// gradient paths, with an unsynchronised control that must fail the same comparison (so
/// the check can fail). Several entries may name one device (replicas sharing it).
///
/// ```
/// use burn::tensor::Device;
/// use kiln_ddp::SelfTest;
///
/// let report = SelfTest::new(vec![Device::flex(), Device::flex()]).run()?;
/// println!("{report}");
/// assert!(report.passed());
/// # Ok::<(), kiln_ddp::DdpError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SelfTest {
    pub(super) devices: Vec<Device>,
    pub(super) half: Precision,
}

impl SelfTest {
    /// Checks on `devices` (one replica each), with bf16 as the half precision.
    pub fn new(devices: Vec<Device>) -> Self {
        Self {
            devices,
            half: Precision::Bf16,
        }
    }

    /// Checks on the devices a device list names (`cpu:0,cuda:0`, as `--devices` takes
    /// them, one replica each), in bf16 besides f32, or f16 on wgpu (lavapipe and many
    /// adapters there have no bf16).
    ///
    /// # Errors
    /// [`DdpError::Config`] naming a device that does not parse or cannot be opened.
    pub fn on(devices: &str) -> Result<Self, DdpError> {
        let config = |err: kiln_core::DeviceSpecError| DdpError::Config(err.to_string());
        let specs = kiln_core::DeviceSpec::parse_list(devices).map_err(config)?;
        let opened = specs.iter().map(|spec| spec.device().map_err(config));
        let half = match specs.first() {
            Some(kiln_core::DeviceSpec::Wgpu) => Precision::F16,
            _ => Precision::Bf16,
        };
        Ok(Self::new(opened.collect::<Result<_, _>>()?).half_precision(half))
    }

    /// The half precision to check besides f32: `F16` where the device has no bf16 (many
    /// wgpu adapters).
    pub fn half_precision(mut self, half: Precision) -> Self {
        self.half = half;
        self
    }

    /// Runs every check; a check that fails is a failed line of the report, not an error.
    ///
    /// # Errors
    /// [`DdpError::Config`] when no device is given, or when the half precision is `F32`.
    pub fn run(&self) -> Result<SelfTestReport, DdpError> {
        if self.devices.is_empty() {
            return Err(DdpError::Config(
                "the self-test needs at least one device".into(),
            ));
        }
        if self.half == Precision::F32 {
            return Err(DdpError::Config(
                "the self-test's half precision must be F16 or Bf16 (F32 is always checked)".into(),
            ));
        }
        let start = Instant::now();
        let mut checks = equivalence(&self.devices, Precision::F32, F32_TOLERANCE);
        checks.extend(equivalence(&self.devices, self.half, HALF_TOLERANCE));
        Ok(SelfTestReport {
            checks,
            elapsed: start.elapsed(),
        })
    }
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
/// (the whole model as one tensor); an error when the reference did not move, since
/// nothing could then be compared.
fn change_error(replicas: &[Vec<f32>], start: &[f32], reference: &[f32]) -> Result<f32, String> {
    if reference == start {
        return Err("the one-device reference did not move: nothing to compare".into());
    }
    let copies: Vec<&[f32]> = replicas.iter().map(Vec::as_slice).collect();
    Ok(kiln_test_support::worst_change(start, reference, &copies).error)
}

/// Replicas on `devices` in `precision` against one device on the union batch; with two or
/// more replicas, the unsynchronised control must miss.
fn equivalence(devices: &[Device], precision: Precision, tolerance: f32) -> Vec<SelfTestCheck> {
    let check = |name: String, outcome| SelfTestCheck { name, outcome };
    let reference = match single(&devices[0], BATCH * devices.len(), precision) {
        Ok(reference) => reference,
        Err(err) => return vec![check(format!("{precision:?} reference"), Err(err))],
    };
    let base = DdpConfig {
        precision: MixedPrecision::new(precision),
        ..DdpConfig::default()
    };
    let mut checks = Vec::new();
    for path in [GradientPath::Host, GradientPath::Device] {
        let config = DdpConfig {
            gradient_path: path,
            ..base.clone()
        };
        let outcome = replicated(devices, config).and_then(|got| {
            let error = change_error(&got, &reference.0, &reference.1)?;
            if error <= tolerance {
                Ok(format!("change error {error:.1e} ≤ {tolerance:.0e}"))
            } else {
                Err(format!("change error {error:.1e} > {tolerance:.0e}"))
            }
        });
        let name = format!("{precision:?}, {} replica(s), {path:?} path", devices.len());
        checks.push(check(name, outcome));
    }
    if devices.len() > 1 {
        let config = DdpConfig {
            mode: SyncMode::Unsynchronized,
            ..base
        };
        let outcome = replicated(devices, config).and_then(|got| {
            let error = change_error(&got, &reference.0, &reference.1)?;
            if error > CONTROL_MARGIN * tolerance {
                Ok(format!("control misses as it must: {error:.1e}"))
            } else {
                Err(format!(
                    "the unsynchronised control passed ({error:.1e}): the check cannot fail"
                ))
            }
        });
        checks.push(check(
            format!("{precision:?}, unsynchronised control"),
            outcome,
        ));
    }
    checks
}
