//! Mixed precision in a pipeline: each stage computes on a working copy of its f32 master
//! parameters, so a bf16 pipeline trains like one device in bf16 accumulating the same
//! micro-batches; under f16 the stages agree on every skipped step, and a checkpoint keeps
//! the loss scale.

use std::collections::HashMap;

use burn::tensor::Device;
use kiln_amp::{GradScaler, GradScalerConfig, MixedPrecision, Precision};
use kiln_checkpoint::{CheckpointStore, Checkpointer, RunIdentity};
use kiln_resnet::ResNet;
use kiln_train::{EpochSummary, LrSchedule, StepRecord, TrainError, TrainObserver};

use kiln_test_support::change_error;

use crate::runtime::test_support::{accumulating_on, by_path, resnet, sgd, shuffled};

use crate::schedule::ScheduleKind;
use crate::{Pipeline, PipelineConfig, PipelineReport};

const BATCH: usize = 24;
const MICRO: usize = 4;
const STEPS: usize = 4;
/// Relative error allowed on parameter changes against one device in the same precision
/// (measured here: equal bit for bit; the control, an f32 pipeline: 1.0).
const TOLERANCE: f32 = kiln_test_support::tolerance::SAME_ORDER;

fn build(device: &Device) -> ResNet {
    resnet(device, 13)
}

fn pipeline(precision: MixedPrecision, steps: usize) -> PipelineReport {
    let config = PipelineConfig {
        schedule: ScheduleKind::OneFOneB,
        micro_batches: MICRO,
        precision,
        ..PipelineConfig::default()
    };
    Pipeline::new(vec![Device::flex(); 2])
        .config(config)
        .train(
            build,
            sgd,
            &LrSchedule::constant(0.1),
            &mut shuffled(BATCH),
            steps,
        )
        .unwrap()
}

fn one_device(precision: MixedPrecision) -> HashMap<String, Vec<f32>> {
    let device = Device::flex().autodiff();
    let model = build(&device);
    accumulating_on(
        &device,
        model,
        (BATCH / MICRO, MICRO),
        0.1,
        precision,
        STEPS,
    )
}

#[test]
fn a_bf16_pipeline_trains_like_one_device_in_bf16_accumulating_the_micro_batches() {
    let start = by_path(&build(&Device::flex().autodiff()));
    let bf16 = || MixedPrecision::new(Precision::Bf16);
    let want = one_device(bf16());
    let got = pipeline(bf16(), STEPS);
    let error = change_error(&start, &want, &got.params);
    assert!(
        error <= TOLERANCE,
        "bf16 pipeline against one device: {error:e}"
    );
    assert_eq!(got.amp.steps, STEPS, "every stage counted its steps");
    // The control: an f32 pipeline differs from bf16 training beyond the tolerance.
    let f32_run = pipeline(MixedPrecision::f32(), STEPS);
    let control = change_error(&start, &want, &f32_run.params);
    assert!(control > 10.0 * TOLERANCE, "control: {control:e}");
}

#[test]
fn under_f16_every_stage_skips_an_overflowing_step_and_a_checkpoint_keeps_the_scale() {
    // A scale of 2^40 overflows f16 gradients on the first backward: both stages must skip
    // (the second stage's gradients may well be finite) and halve their scale alike.
    let planted = || {
        MixedPrecision::new(Precision::F16).with_scaler(GradScaler::new(GradScalerConfig {
            init_scale: 2f32.powi(40),
            ..GradScalerConfig::default()
        }))
    };
    let start = by_path(&build(&Device::flex().autodiff()));
    let one = pipeline(planted(), 1);
    assert_eq!(one.params, start, "the skipped step changed nothing");
    assert_eq!((one.amp.steps, one.amp.skipped), (1, 1));
    assert_eq!(one.amp.scale, 2f32.powi(39));
    // Checkpointed at step 2 and resumed, the run (its scale included) continues bit for bit.
    let dir = std::env::temp_dir().join(format!("kiln-pipe-f16-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let identity = RunIdentity::new("resnet18 width 2").with("precision", "f16");
    let run = |from: Option<std::path::PathBuf>| {
        let config = PipelineConfig {
            micro_batches: MICRO,
            precision: planted(),
            ..PipelineConfig::default()
        };
        let saver = Checkpointer::new(CheckpointStore::new(&dir, 10), 2, identity.clone());
        let scales = Scales::default();
        let mut pipeline = Pipeline::new(vec![Device::flex(); 2])
            .config(config)
            .checkpoint(saver)
            .observer(scales.clone());
        if let Some(path) = from {
            pipeline = pipeline.resume(path, identity.clone());
        }
        let report = pipeline
            .train(
                build,
                sgd,
                &LrSchedule::constant(0.1),
                &mut shuffled(BATCH),
                STEPS,
            )
            .unwrap();
        let scales = scales.0.lock().unwrap().clone();
        (report, scales)
    };
    let (whole, scales) = run(None);
    // Every step's record carries the scale the next step uses, as the trainer's do.
    assert_eq!(scales.len(), STEPS);
    assert_eq!(
        scales[0],
        Some(2f32.powi(39)),
        "halved by the skipped first step"
    );
    assert_eq!(scales.last().copied().flatten(), Some(whole.amp.scale));
    let (resumed, _) = run(Some(CheckpointStore::new(&dir, 10).path_for(2)));
    assert_eq!(resumed.params, whole.params);
    assert_eq!(resumed.amp.scale, whole.amp.scale);
    std::fs::remove_dir_all(&dir).ok();
}

/// Records every step's loss scale.
#[derive(Clone, Default)]
struct Scales(std::sync::Arc<std::sync::Mutex<Vec<Option<f32>>>>);

impl TrainObserver for Scales {
    fn on_step(&mut self, step: &StepRecord) -> Result<(), TrainError> {
        self.0.lock().unwrap().push(step.loss_scale);
        Ok(())
    }
    fn on_epoch(&mut self, _: &EpochSummary) -> Result<(), TrainError> {
        Ok(())
    }
}
