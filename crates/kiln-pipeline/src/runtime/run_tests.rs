//! A pipeline as a whole run. Its checkpoints: resumed, the run continues bit for bit; the
//! checkpoint is of the data-parallel format, so it resumes under another plan (another split
//! and schedule, one device accumulating the micro-batches) and a one-device checkpoint
//! resumes as a pipeline. A stop request. Validation through the pipeline.

use std::collections::HashMap;
use std::path::PathBuf;

use burn::tensor::Device;
use kiln_checkpoint::{CheckpointStore, Checkpointer, RunIdentity, resume};
use kiln_data::{DataLoader, SyntheticImages};
use kiln_resnet::ResNet;
use kiln_train::{
    EpochSummary, LrSchedule, StepRecord, StopFlag, TrainError, TrainObserver, TrainPosition,
    Trainer,
};

use kiln_test_support::change_error;

use crate::runtime::test_support::{by_path, fit_quietly, resnet, sgd, shuffled};
use crate::schedule::ScheduleKind;
use crate::{Pipeline, PipelineConfig, PipelineReport};

/// Samples per step; 96 samples make 4 steps an epoch.
const BATCH: usize = 24;
const MICRO: usize = 4;
/// Two epochs and a half: checkpoints every 2 steps land mid-epoch and at an epoch's end.
const STEPS: usize = 10;
/// Other plans add the same micro-batch gradients in the same order (measured here: equal
/// bit for bit, every comparison below; the control without momentum: 0.43); other CPUs may
/// round a split differently.
const TOLERANCE: f32 = kiln_test_support::tolerance::SAME_ORDER;

fn build(device: &Device) -> ResNet {
    resnet(device, 11)
}

fn identity() -> RunIdentity {
    RunIdentity::new("resnet18 width 2").with("samples per step", BATCH)
}

fn schedule() -> LrSchedule {
    LrSchedule::constant(0.1).warmup(2).cosine(STEPS, 0.0)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-pipeckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Counts what it is told, and raises `stop` once step `stop_after` is recorded.
#[derive(Default)]
struct Seen {
    steps: Vec<usize>,
    epochs: Vec<usize>,
    stop: Option<(usize, StopFlag)>,
    told: std::sync::Arc<std::sync::Mutex<(Vec<usize>, Vec<usize>)>>,
}

impl TrainObserver for Seen {
    fn on_step(&mut self, step: &StepRecord) -> Result<(), TrainError> {
        self.steps.push(step.step);
        if let Some((at, flag)) = &self.stop
            && step.step == *at
        {
            flag.request();
        }
        self.told.lock().unwrap().0 = self.steps.clone();
        Ok(())
    }
    fn on_epoch(&mut self, epoch: &EpochSummary) -> Result<(), TrainError> {
        self.epochs.push(epoch.epoch);
        self.told.lock().unwrap().1 = self.epochs.clone();
        Ok(())
    }
}

/// A pipeline of `stages` stages (`kind`, [`MICRO`] micro-batches) checkpointing every 2
/// steps into `dir`, from `from` when given.
fn pipeline(
    kind: ScheduleKind,
    stages: usize,
    dir: &std::path::Path,
    from: Option<PathBuf>,
    observer: Option<Seen>,
) -> PipelineReport {
    let config = PipelineConfig {
        schedule: kind,
        micro_batches: MICRO,
        ..PipelineConfig::default()
    };
    let saver = Checkpointer::new(CheckpointStore::new(dir, 10), 2, identity());
    let mut pipeline = Pipeline::new(vec![Device::flex(); stages])
        .config(config)
        .checkpoint(saver);
    if let Some(path) = from {
        pipeline = pipeline.resume(path, identity());
    }
    if let Some(observer) = observer {
        if let Some((_, flag)) = &observer.stop {
            pipeline = pipeline.stop_flag(flag.clone());
        }
        pipeline = pipeline.observer(observer);
    }
    pipeline
        .train(build, sgd, &schedule(), &mut shuffled(BATCH), STEPS)
        .unwrap()
}

/// One device accumulating [`MICRO`] micro-batches per step, from the checkpoint `from`
/// (its optimizer state dropped when `fresh_optimizer`), checkpointing into `dir`.
fn one_device(
    dir: &std::path::Path,
    from: Option<PathBuf>,
    fresh_optimizer: bool,
) -> HashMap<String, Vec<f32>> {
    let device = Device::flex().autodiff();
    let (model, optimizer, position) = match from {
        Some(path) => {
            let r = resume(&path, &identity(), build(&device), sgd()).unwrap();
            let o = if fresh_optimizer { sgd() } else { r.optimizer };
            (r.model, o, r.position)
        }
        None => (build(&device), sgd(), TrainPosition::default()),
    };
    let (model, _) = fit_quietly(
        Trainer::builder(model, optimizer)
            .schedule(schedule())
            .train_loader(shuffled(BATCH / MICRO))
            .accumulation_steps(MICRO)
            .max_steps(STEPS)
            .checkpoint(Checkpointer::new(
                CheckpointStore::new(dir, 10),
                2,
                identity(),
            ))
            .resume_at(position),
    );
    by_path(&model)
}

#[test]
fn a_resumed_pipeline_continues_bit_for_bit_and_its_checkpoint_resumes_under_any_plan() {
    let start = by_path(&build(&Device::flex().autodiff()));
    let dir = scratch("whole");
    let seen = Seen::default();
    let told = std::sync::Arc::clone(&seen.told);
    let whole = pipeline(ScheduleKind::OneFOneB, 2, &dir, None, Some(seen));
    assert_eq!(whole.losses.len(), STEPS);
    let (steps, epochs) = told.lock().unwrap().clone();
    assert_eq!(steps, (0..STEPS).collect::<Vec<_>>(), "every step observed");
    // Two whole epochs, and the third's first half where the step budget ends it (as the
    // trainer does: one loop).
    assert_eq!(epochs, vec![0, 1, 2], "every epoch summarised");
    let store = CheckpointStore::new(&dir, 10);
    let saved: Vec<usize> = store.list().unwrap().iter().map(|(s, _)| *s).collect();
    assert_eq!(saved, vec![2, 4, 6, 8, 10]);
    let manifest = kiln_checkpoint::Manifest::read(&store.path_for(2)).unwrap();
    assert_eq!(manifest.optimizer.len(), 2, "one optimizer part per stage");

    // The same plan, resumed mid-epoch (step 2) and at an epoch's end (step 4): bit for bit.
    for at in [2, 4] {
        let again = scratch(&format!("again-{at}"));
        let resumed = pipeline(
            ScheduleKind::OneFOneB,
            2,
            &again,
            Some(store.path_for(at)),
            None,
        );
        assert_eq!(resumed.losses, whole.losses[at..], "losses after step {at}");
        assert_eq!(resumed.params, whole.params, "weights, resumed at {at}");
        std::fs::remove_dir_all(&again).ok();
    }
    // Another split and schedule (3 stages, GPipe).
    let other = scratch("other");
    let gpipe = pipeline(
        ScheduleKind::GPipe,
        3,
        &other,
        Some(store.path_for(2)),
        None,
    );
    let error = change_error(&start, &whole.params, &gpipe.params);
    assert!(error <= TOLERANCE, "resumed as 3 GPipe stages: {error:e}");
    // One device accumulating the same micro-batches, from the pipeline's checkpoint.
    let single = one_device(&other, Some(store.path_for(4)), false);
    let error = change_error(&start, &whole.params, &single);
    assert!(error <= TOLERANCE, "resumed on one device: {error:e}");
    // The control: the same without the optimizer's state (momentum) differs.
    let control = one_device(&other, Some(store.path_for(4)), true);
    let error = change_error(&start, &whole.params, &control);
    assert!(error > 100.0 * TOLERANCE, "control: {error:e}");
    // And a one-device checkpoint resumes as a pipeline.
    let single_dir = scratch("single");
    let _ = one_device(&single_dir, None, false);
    let from_single = pipeline(
        ScheduleKind::OneFOneB,
        2,
        &other,
        Some(CheckpointStore::new(&single_dir, 10).path_for(6)),
        None,
    );
    let error = change_error(&start, &whole.params, &from_single.params);
    assert!(
        error <= TOLERANCE,
        "one device's checkpoint as a pipeline: {error:e}"
    );
    for d in [dir, other, single_dir] {
        std::fs::remove_dir_all(&d).ok();
    }
}

#[test]
fn a_stop_request_ends_the_pipeline_after_the_step_with_a_checkpoint() {
    let dir = scratch("stop");
    let whole = pipeline(
        ScheduleKind::OneFOneB,
        2,
        &scratch("stop-whole"),
        None,
        None,
    );
    let seen = Seen {
        stop: Some((3, StopFlag::new())),
        ..Seen::default()
    };
    let stopped = pipeline(ScheduleKind::OneFOneB, 2, &dir, None, Some(seen));
    let at = TrainPosition {
        step: 4,
        epoch: 1,
        step_in_epoch: 0,
    };
    // Raised while step 3 was observed: the stages agree after it and stop there, as the
    // trainer's replicas do (one loop).
    assert_eq!(stopped.stopped_at, Some(at));
    let store = CheckpointStore::new(&dir, 10);
    assert_eq!(store.latest().unwrap(), Some(store.path_for(4)));
    let resumed = pipeline(
        ScheduleKind::OneFOneB,
        2,
        &scratch("stop-again"),
        Some(store.path_for(4)),
        None,
    );
    assert_eq!(resumed.params, whole.params);
    // Another run's checkpoint is refused before any stage starts, naming the difference.
    let err = Pipeline::new(vec![Device::flex(); 2])
        .resume(store.path_for(4), identity().with("lr", 0.5))
        .train(build, sgd, &schedule(), &mut shuffled(BATCH), STEPS)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("lr: checkpoint (not set), this run 0.5"),
        "{err}"
    );
    for d in ["stop", "stop-whole", "stop-again"] {
        std::fs::remove_dir_all(scratch(d)).ok();
    }
}

fn valid_loader() -> DataLoader {
    DataLoader::builder(SyntheticImages::new(40, 4, 9, [3, 8, 8]))
        .batch_size(16)
        .device(Device::flex())
        .build()
}

#[test]
fn validation_through_the_pipeline_scores_like_one_device() {
    // One device accumulating the same micro-batches, validated after each epoch.
    let (_, report) = fit_quietly(
        Trainer::builder(build(&Device::flex().autodiff()), sgd())
            .schedule(schedule())
            .train_loader(shuffled(BATCH / MICRO))
            .accumulation_steps(MICRO)
            .valid_loader(valid_loader())
            .max_steps(8),
    );
    let want: Vec<(f32, f32)> = report
        .epochs
        .iter()
        .map(|e| (e.valid_loss.unwrap(), e.valid_accuracy.unwrap()))
        .collect();
    assert_eq!(want.len(), 2);
    // One loop: an epoch's training loss is sample-weighted in both.
    let want_train: Vec<f32> = report.epochs.iter().map(|e| e.train_loss).collect();
    // 2 stages, and 2 stages of 2 interleaved chunks each (activations cross back to stage
    // 0); the validation batches (16, 16, 8) are cut into up to 4 micro-batches.
    for kind in [
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved { virtual_stages: 2 },
    ] {
        let config = PipelineConfig {
            schedule: kind,
            micro_batches: MICRO,
            ..PipelineConfig::default()
        };
        let got = Pipeline::new(vec![Device::flex(); 2])
            .config(config)
            .valid_loader(valid_loader())
            .train(build, sgd, &schedule(), &mut shuffled(BATCH), 8)
            .unwrap();
        for (epoch, want) in got.epochs.iter().zip(&want_train) {
            let loss = epoch.train_loss;
            assert!(
                (loss - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{kind}: epoch {} training loss {loss} vs one device {want}",
                epoch.epoch
            );
        }
        let got: Vec<(f32, f32)> = got
            .epochs
            .iter()
            .map(|e| (e.valid_loss.unwrap(), e.valid_accuracy.unwrap()))
            .collect();
        for ((loss, accuracy), (want_loss, want_accuracy)) in got.iter().zip(&want) {
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss.abs().max(1.0),
                "{kind}: validation loss {loss} vs one device {want_loss}"
            );
            // Within one of the 40 validation samples: a near-tie may round either way.
            assert!(
                (accuracy - want_accuracy).abs() <= 1.0 / 40.0 + 1e-6,
                "{kind}: validation accuracy {accuracy} vs one device {want_accuracy}"
            );
        }
        assert_eq!(got.len(), want.len());
    }
}
