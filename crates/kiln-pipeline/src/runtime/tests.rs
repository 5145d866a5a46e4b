//! The pipeline trains exactly like one device accumulating the same micro-batches: per
//! tensor, the change of every parameter matches to 1e-5 relative (measured: bit-identical for
//! every schedule, P and M here,
//! since every stage adds micro-batch gradients in the same order), and a 0.1 % wrong update
//! exceeds that. Plus memory per stage, 1F1B's in-flight bound, and bad input.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::{Device, Tensor};
use kiln_core::{ImageClassifier, SegmentId, Segmented, init_module};
use kiln_data::{DataLoader, SyntheticImages};
use kiln_resnet::{ResNet, ResNetConfig, StemKind};
use kiln_train::{LocalStep, LrSchedule, Trainer};

use crate::runtime::empty::float_bytes;
use kiln_test_support::change_error;
use kiln_test_support::tolerance::{OTHER_KERNELS, REORDERED, SAME_ORDER};

use crate::runtime::test_support::by_path;
use crate::schedule::ScheduleKind;
use crate::{Pipeline, PipelineConfig, PipelineError};

const BATCH: usize = 24;
const STEPS: usize = 3;
/// Every schedule adds the same micro-batch gradients in the same order as one device.
const TOLERANCE: f32 = SAME_ORDER;
/// Data-parallel pipelines add the stage copies' gradients in another order than one device
/// accumulating (measured here: 9.0e-6).
const DATA_PARALLEL_TOLERANCE: f32 = REORDERED;
/// Clipped updates are small (lr × 0.5 over the whole model, ~1e-4 per value), so a one-ulp
/// difference in a parameter (a different summation order of the data-parallel reduction, the
/// norm's f32 transport) is ~5e-5 of its change (measured: 5.7e-5 with D = 2, 0 with D = 1).
const CLIPPED_TOLERANCE: f32 = OTHER_KERNELS;

fn build(device: &Device) -> ResNet {
    init_module(device, 5, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(2)
            .init(device)
    })
}

fn data() -> SyntheticImages {
    SyntheticImages::new(96, 4, 3, [3, 8, 8])
}

fn optimizer() -> burn::optim::ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}

fn loader(batch: usize) -> DataLoader {
    DataLoader::builder(data())
        .batch_size(batch)
        .shuffle(2)
        .device(Device::flex().autodiff())
        .build()
}

/// One device, `micro` micro-batches accumulated per step of [`BATCH`] samples.
fn single(micro: usize, lr: f64) -> HashMap<String, Vec<f32>> {
    accumulating(BATCH / micro, micro, lr)
}

/// One device, `micro` micro-batches of `size` samples accumulated per step.
fn accumulating(size: usize, micro: usize, lr: f64) -> HashMap<String, Vec<f32>> {
    accumulating_with(size, micro, lr, LocalStep::new())
}

/// [`accumulating`] with the gradient rule of `step` (e.g. clipping).
fn accumulating_with(
    size: usize,
    micro: usize,
    lr: f64,
    step: LocalStep,
) -> HashMap<String, Vec<f32>> {
    let (model, _) = Trainer::builder(build(&Device::flex().autodiff()), optimizer())
        .gradient_step(step)
        .schedule(LrSchedule::constant(lr))
        .train_loader(loader(size))
        .accumulation_steps(micro)
        .max_steps(STEPS)
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap()
        .fit()
        .unwrap();
    by_path(&model)
}

/// Trains [`build`]'s ResNet on `stages` CPU stages for `steps` steps of `batch` samples.
fn run(
    kind: ScheduleKind,
    stages: usize,
    micro: usize,
    batch: usize,
    steps: usize,
) -> Result<crate::PipelineReport, PipelineError> {
    run_groups(kind, 1, stages, micro, batch, steps)
}

/// [`run`] with `groups` data-parallel pipelines.
fn run_groups(
    kind: ScheduleKind,
    groups: usize,
    stages: usize,
    micro: usize,
    batch: usize,
    steps: usize,
) -> Result<crate::PipelineReport, PipelineError> {
    let config = PipelineConfig {
        schedule: kind,
        micro_batches: micro,
        data_parallel: groups,
        ..PipelineConfig::default()
    };
    run_config(config, stages, batch, steps)
}

/// Trains [`build`]'s ResNet with `config` on `stages` CPU stages per pipeline.
fn run_config(
    config: PipelineConfig,
    stages: usize,
    batch: usize,
    steps: usize,
) -> Result<crate::PipelineReport, PipelineError> {
    Pipeline::new(vec![Device::flex(); config.data_parallel * stages])
        .config(config)
        .train(
            build,
            optimizer,
            &LrSchedule::constant(0.1),
            &mut loader(batch),
            steps,
        )
}

fn pipeline(kind: ScheduleKind, stages: usize, micro: usize) -> crate::PipelineReport {
    run(kind, stages, micro, BATCH, STEPS)
        .unwrap_or_else(|err| panic!("{kind} P={stages} M={micro}: {err}"))
}

#[test]
fn every_schedule_trains_like_one_device_accumulating_the_micro_batches() {
    let start = by_path(&build(&Device::flex().autodiff()));
    let mut references = HashMap::new();
    for stages in [2, 3, 4] {
        for micro in [stages, 2 * stages] {
            let want = references
                .entry(micro)
                .or_insert_with(|| single(micro, 0.1))
                .clone();
            let kinds = [
                ScheduleKind::GPipe,
                ScheduleKind::OneFOneB,
                ScheduleKind::Interleaved { virtual_stages: 2 },
            ];
            for kind in kinds {
                let report = pipeline(kind, stages, micro);
                let error = change_error(&start, &want, &report.params);
                assert!(
                    error <= TOLERANCE,
                    "{kind}, P={stages}, M={micro}: relative error of the change {error:e}"
                );
            }
        }
    }
    // The control: a 0.1 % larger update exceeds the tolerance.
    let wrong = single(4, 0.1 * 1.001);
    let error = change_error(&start, &references[&4], &wrong);
    assert!(error > TOLERANCE, "the control passed: {error:e}");
}

#[test]
fn data_parallel_pipelines_train_like_one_device_accumulating_every_micro_batch() {
    // D = 2 pipelines of P = 2 stages, M = 2: each step takes two batches of BATCH, so one
    // device accumulates D·M = 4 micro-batches of BATCH/2. The copies of a stage add their
    // gradients (a different summation order: not bit-identical, within DATA_PARALLEL_TOLERANCE).
    let start = by_path(&build(&Device::flex().autodiff()));
    let want = accumulating(BATCH / 2, 4, 0.1);
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        let report = run_groups(kind, 2, 2, 2, BATCH, STEPS)
            .unwrap_or_else(|err| panic!("{kind} 2x2: {err}"));
        assert_eq!(report.stages.len(), 2, "the first pipeline's stages");
        let error = change_error(&start, &want, &report.params);
        assert!(
            error <= DATA_PARALLEL_TOLERANCE,
            "{kind} 2x2: relative error of the change {error:e}"
        );
    }
    // The control: one pipeline alone (half the step's samples) misses by far.
    let alone = run(ScheduleKind::OneFOneB, 2, 2, BATCH, STEPS).expect("one pipeline");
    let error = change_error(&start, &want, &alone.params);
    assert!(
        error > DATA_PARALLEL_TOLERANCE,
        "the control passed: {error:e}"
    );
    // Devices that do not divide into the groups are refused with the reason.
    let err = Pipeline::new(vec![Device::flex(); 3])
        .config(PipelineConfig {
            data_parallel: 2,
            ..PipelineConfig::default()
        })
        .train(
            build,
            optimizer,
            &LrSchedule::constant(0.1),
            &mut loader(BATCH),
            1,
        )
        .expect_err("3 devices, 2 groups");
    assert!(
        err.to_string()
            .contains("cannot form 2 data-parallel pipelines"),
        "{err}"
    );
}

#[test]
fn clipping_takes_the_norm_over_every_stage() {
    // The norm is over the whole model: each stage's share alone would clip differently. The
    // gradient norm here is well above 0.5 (the control shows the clipping changes the run).
    let start = by_path(&build(&Device::flex().autodiff()));
    let max_norm = 0.5;
    let clipped = |size, micro| {
        let step = LocalStep::new()
            .with_max_grad_norm(max_norm)
            .expect("a valid norm");
        accumulating_with(size, micro, 0.1, step)
    };
    let want = clipped(BATCH / 2, 2);
    for (groups, kind) in [(1, ScheduleKind::OneFOneB), (2, ScheduleKind::GPipe)] {
        // D pipelines of BATCH/D samples cut in 2: one device accumulates 2·D micro-batches.
        let want = if groups == 1 {
            want.clone()
        } else {
            clipped(BATCH / 2 / groups, 2 * groups)
        };
        let config = PipelineConfig {
            schedule: kind,
            micro_batches: 2,
            data_parallel: groups,
            max_grad_norm: Some(max_norm),
            ..PipelineConfig::default()
        };
        let batch = BATCH / groups;
        let report = run_config(config, 2, batch, STEPS)
            .unwrap_or_else(|err| panic!("{kind} D={groups}: {err}"));
        let error = change_error(&start, &want, &report.params);
        assert!(
            error <= CLIPPED_TOLERANCE,
            "{kind} D={groups}: relative error of the change {error:e}"
        );
    }
    // The control: without clipping the run differs by far (measured: 4.8).
    let unclipped = run(ScheduleKind::OneFOneB, 2, 2, BATCH, STEPS).expect("a run");
    let error = change_error(&start, &want, &unclipped.params);
    assert!(error > CLIPPED_TOLERANCE, "the control passed: {error:e}");
    // A norm that is not positive and finite is refused.
    for bad in [0.0, -1.0, f32::NAN] {
        let config = PipelineConfig {
            max_grad_norm: Some(bad),
            ..PipelineConfig::default()
        };
        let err = run_config(config, 2, BATCH, 1).expect_err("a bad norm");
        assert!(err.to_string().contains("max_grad_norm"), "{err}");
    }
}

#[test]
fn stages_hold_only_their_parameters_and_1f1b_bounds_the_activations_in_flight() {
    let full = float_bytes(&build(&Device::flex().autodiff()));
    let mut first_stage_peaks = Vec::new();
    for (kind, micro) in [(ScheduleKind::OneFOneB, 8), (ScheduleKind::GPipe, 8)] {
        let stages = 4;
        let report = pipeline(kind, stages, micro);
        // Counted per stage: at least its parameters, gradients and momentum.
        for (index, stage) in report.stages.iter().enumerate() {
            let peak = stage
                .peak_bytes
                .expect("the tests install the tracking allocator");
            assert!(
                peak >= 3 * stage.param_bytes as u64,
                "{kind}: stage {index} peaked at {peak} bytes, holding {} of parameters",
                stage.param_bytes
            );
        }
        first_stage_peaks.push(report.stages[0].peak_bytes.unwrap());
        let held: usize = report.stages.iter().map(|s| s.param_bytes).sum();
        assert_eq!(
            held, full,
            "{kind}: the stages hold the model once between them"
        );
        for (index, stage) in report.stages.iter().enumerate() {
            assert!(
                stage.param_bytes < full,
                "{kind}: stage {index} holds a full copy"
            );
            let bound = match kind {
                ScheduleKind::OneFOneB => micro.min(stages - index),
                _ => micro,
            };
            assert_eq!(stage.peak_in_flight, bound, "{kind}: stage {index}");
            // Compute times per chunk; the schedule's prediction cannot end before a stage
            // has done its own work on every micro-batch.
            assert_eq!(stage.forward_time.len(), 1, "{kind}: one chunk per stage");
            assert_eq!(stage.backward_time.len(), 1, "{kind}: one chunk per stage");
            let own = (stage.forward_time[0] + stage.backward_time[0]) * micro as u32;
            assert!(!own.is_zero(), "{kind}: stage {index} timed its compute");
            // (1 µs for the seconds-as-f64 round trip of the simulation)
            assert!(
                report.predicted_step_time + Duration::from_micros(1) >= own,
                "{kind}: predicted {:?} < stage {index}'s own work {own:?}",
                report.predicted_step_time
            );
        }
    }
    // Stage 0 holds 4 micro-batches' activations under 1F1B, all 8 under GPipe.
    let [one_f_one_b, gpipe] = first_stage_peaks[..] else {
        unreachable!("two runs")
    };
    assert!(
        one_f_one_b < gpipe,
        "stage 0's peak: 1F1B {one_f_one_b} bytes, GPipe {gpipe}"
    );
}

#[test]
fn bad_shapes_are_refused_with_the_reason() {
    let refused = |kind, stages, micro, batch| {
        run(kind, stages, micro, batch, 1)
            .expect_err("refused")
            .to_string()
    };
    let message = refused(ScheduleKind::OneFOneB, 11, 11, 24);
    assert!(message.contains("10 segments"), "{message}");
    let message = refused(ScheduleKind::OneFOneB, 4, 2, 24);
    assert!(
        message.contains("at least as many micro-batches as stages"),
        "{message}"
    );
    let message = refused(ScheduleKind::GPipe, 2, 8, 4);
    assert!(
        message.contains("cannot be cut into 8 micro-batches"),
        "{message}"
    );
    let message = refused(ScheduleKind::GPipe, 0, 2, 4);
    assert!(message.contains("at least one device"), "{message}");
}

/// Without the `mpi` feature a world of processes cannot exist: a communicator given to
/// `across_processes` is refused, not ignored (the stages would train in this process alone).
#[cfg(not(feature = "mpi"))]
#[test]
fn stages_across_processes_are_refused_without_the_mpi_feature() {
    let world = kiln_comm::InProcessGroup::new(2).build().remove(0);
    let message = Pipeline::new(vec![Device::flex(); 2])
        .across_processes(world)
        .train(
            build,
            optimizer,
            &LrSchedule::constant(0.1),
            &mut loader(4),
            1,
        )
        .expect_err("refused")
        .to_string();
    assert!(message.contains("`mpi` feature"), "{message}");
}

/// ResNet whose fourth middle segment (a block on stage 1 of 2) panics.
#[derive(Module, Debug)]
struct Faulty {
    inner: ResNet,
}

impl ImageClassifier for Faulty {
    fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
        kiln_core::forward_segments(self, images)
    }
}

impl Segmented for Faulty {
    type Input = Tensor<4>;
    type Hidden = Tensor<4>;
    type Output = Tensor<2>;

    fn num_middle_segments(&self) -> usize {
        self.inner.num_middle_segments()
    }
    fn forward_input(&self, input: Tensor<4>) -> Tensor<4> {
        self.inner.forward_input(input)
    }
    fn forward_middle(&self, index: usize, hidden: Tensor<4>) -> Tensor<4> {
        assert!(index != 5, "planted failure in block 5");
        self.inner.forward_middle(index, hidden)
    }
    fn forward_output(&self, hidden: Tensor<4>) -> Tensor<2> {
        self.inner.forward_output(hidden)
    }
    fn visit_segment<V: burn::module::ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V) {
        self.inner.visit_segment(segment, visitor);
    }
}

#[test]
fn a_panicking_stage_stops_every_stage_promptly_with_its_error() {
    let config = PipelineConfig {
        schedule: ScheduleKind::OneFOneB,
        micro_batches: 4,
        timeout: Duration::from_secs(60),
        ..PipelineConfig::default()
    };
    let started = Instant::now();
    let err = Pipeline::new(vec![Device::flex(); 2])
        .config(config)
        .train(
            |device: &Device| Faulty {
                inner: build(device),
            },
            optimizer,
            &LrSchedule::constant(0.1),
            &mut loader(BATCH),
            2,
        )
        .expect_err("the planted panic fails the run");
    assert!(
        matches!(&err, PipelineError::Stage { stage: 1, message } if message.contains("planted")),
        "the root cause, from stage 1: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "not promptly: {:?}",
        started.elapsed()
    );
}

#[test]
fn an_emulated_slow_stage_trains_the_same_and_is_the_busy_one() {
    let config = |slowdown: Vec<f64>| PipelineConfig {
        schedule: ScheduleKind::OneFOneB,
        micro_batches: 2,
        emulated_slowdown: slowdown,
        ..PipelineConfig::default()
    };
    let plain = run_config(config(Vec::new()), 2, BATCH, 2).unwrap();
    let slow = run_config(config(vec![1.0, 4.0]), 2, BATCH, 2).unwrap();
    assert_eq!(plain.params, slow.params, "waiting changes no arithmetic");
    // Stage 1 computes four times as long as it would: stage 0 waits for it.
    assert!(
        slow.stages[1].busy_fraction > slow.stages[0].busy_fraction,
        "{:?}",
        slow.stages
    );
    for (bad, message) in [
        (vec![1.0, 0.5], "at least 1"),
        (vec![1.0, f64::NAN], "at least 1"),
        (vec![2.0], "names 1 stages, the pipeline has 2"),
    ] {
        let err = run_config(config(bad), 2, BATCH, 1).unwrap_err();
        assert!(err.to_string().contains(message), "{err}");
    }
}
