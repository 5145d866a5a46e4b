//! Exact resume, and what a crash, a corrupted file or another run's checkpoint does.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{ModuleOptimizer, SgdConfig};
use burn::tensor::Device;
use kiln_core::{fingerprint, init_module};
use kiln_data::{DataLoader, SyntheticImages, Transform};
use kiln_resnet::{ResNet, ResNetConfig, StemKind};
use kiln_train::{LrSchedule, TrainPosition, Trainer};

use crate::{CheckpointError, CheckpointStore, Checkpointer, MODEL_FILE, RunIdentity, resume};

/// A fresh directory under the system's temporary one.
pub(super) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub(super) fn model(device: &Device) -> ResNet {
    init_module(device, 3, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(2)
            .init(device)
    })
}

pub(super) fn optimizer() -> ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .with_weight_decay(Some(WeightDecayConfig::new(5e-4)))
        .init()
}

pub(super) fn identity() -> RunIdentity {
    RunIdentity::new("resnet18 width 2")
        .with("lr", 0.05)
        .with("batch", 8)
}

/// 12 steps per epoch, augmented, shuffled per epoch.
fn loader(device: &Device) -> DataLoader {
    DataLoader::builder(SyntheticImages::new(96, 4, 5, [3, 8, 8]))
        .batch_size(8)
        .shuffle(9)
        .num_workers(1)
        .transforms(Transform::cifar_augmentation())
        .device(device.clone())
        .build()
}

const STEPS: usize = 30;

/// Trains from `start` (a fresh run when `None`) to step `STEPS`, checkpointing every 5
/// steps into `dir`; the losses of the steps it ran and the final weights' fingerprint.
pub(super) fn train(
    dir: &Path,
    start: Option<(ResNet, ModuleOptimizer, TrainPosition)>,
) -> (Vec<f32>, u64) {
    train_stopping(dir, start, None).0
}

/// Raises a stop flag when step `at` (0-based) has been recorded.
struct StopAt {
    at: usize,
    flag: kiln_train::StopFlag,
}

impl kiln_train::TrainObserver for StopAt {
    fn on_step(&mut self, step: &kiln_train::StepRecord) -> Result<(), kiln_train::TrainError> {
        if step.step == self.at {
            self.flag.request();
        }
        Ok(())
    }
    fn on_epoch(&mut self, _: &kiln_train::EpochSummary) -> Result<(), kiln_train::TrainError> {
        Ok(())
    }
}

/// What [`train_stopping`] returns: the losses and final fingerprint, and where it stopped.
type Trained = ((Vec<f32>, u64), Option<TrainPosition>);

/// [`train`], stopped after step `stop` (0-based) when given; also where it stopped.
fn train_stopping(
    dir: &Path,
    start: Option<(ResNet, ModuleOptimizer, TrainPosition)>,
    stop: Option<usize>,
) -> Trained {
    train_into(CheckpointStore::new(dir, 10), start, stop).unwrap()
}

/// [`train_stopping`] into `store`, with the run's error.
pub(super) fn train_into(
    store: CheckpointStore,
    start: Option<(ResNet, ModuleOptimizer, TrainPosition)>,
    stop: Option<usize>,
) -> Result<Trained, kiln_train::TrainError> {
    let device = Device::flex().autodiff();
    let (model, optimizer, position) =
        start.unwrap_or_else(|| (model(&device), optimizer(), TrainPosition::default()));
    let saver = Checkpointer::new(store, 5, identity());
    let mut builder = Trainer::builder(model, optimizer)
        .schedule(LrSchedule::constant(0.05).warmup(3).cosine(STEPS, 0.0))
        .train_loader(loader(&device))
        .max_steps(STEPS)
        .checkpoint(saver)
        .resume_at(position)
        .progress(false)
        .log_epochs(false);
    if let Some(at) = stop {
        let flag = kiln_train::StopFlag::new();
        builder = builder
            .stop_flag(flag.clone())
            .observer(StopAt { at, flag });
    }
    let (model, report) = builder.build()?.fit()?;
    Ok((
        (
            report.steps.iter().map(|s| s.loss).collect(),
            fingerprint(&model),
        ),
        report.stopped_at,
    ))
}

#[test]
fn a_stop_request_saves_at_the_next_step_and_the_run_resumes_from_there() {
    let dir = scratch("stop");
    let (whole, _) = train_stopping(&dir, None, None);
    // Mid-epoch (after step 7 of 12) and at an epoch's end (after step 12).
    for asked in [6, 11] {
        let stopped_dir = scratch(&format!("stop-{asked}"));
        let ((losses, _), stopped) = train_stopping(&stopped_dir, None, Some(asked));
        let stopped = stopped.expect("the run stopped early");
        assert_eq!(
            stopped.step,
            asked + 1,
            "after the step during which it was asked"
        );
        assert_eq!(losses.len(), asked + 1);
        let store = CheckpointStore::new(&stopped_dir, 10);
        assert_eq!(
            store.latest().unwrap(),
            Some(store.path_for(asked + 1)),
            "saved where it stopped"
        );
        let device = Device::flex().autodiff();
        let resumed = resume(
            &store.path_for(asked + 1),
            &identity(),
            model(&device),
            optimizer(),
        )
        .unwrap();
        let (rest, weights) = train(
            &stopped_dir,
            Some((resumed.model, resumed.optimizer, resumed.position)),
        );
        assert_eq!(
            [losses, rest].concat(),
            whole.0,
            "stopped after step {}",
            asked + 1
        );
        assert_eq!(weights, whole.1);
        std::fs::remove_dir_all(&stopped_dir).ok();
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_resumed_run_continues_bit_for_bit_like_the_uninterrupted_one() {
    let dir = scratch("exact");
    let (losses, final_weights) = train(&dir, None);
    assert_eq!(losses.len(), STEPS);
    let store = CheckpointStore::new(&dir, 10);
    let steps: Vec<usize> = store.list().unwrap().iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps,
        vec![5, 10, 15, 20, 25, 30],
        "every 5 steps and the last"
    );
    let device = Device::flex().autodiff();
    // Mid-epoch (step 5 of 12), and in the third epoch (step 25 = 2 x 12 + 1).
    for at in [5, 25] {
        let resumed = resume(
            &store.path_for(at),
            &identity(),
            model(&device),
            optimizer(),
        )
        .unwrap();
        assert_eq!(resumed.position.step, at);
        assert_eq!(resumed.position.epoch, at / 12);
        assert_eq!(resumed.position.step_in_epoch, at % 12);
        let again = scratch(&format!("exact-{at}"));
        let (rest, weights) = train(
            &again,
            Some((resumed.model, resumed.optimizer, resumed.position)),
        );
        assert_eq!(rest, losses[at..], "the losses after step {at}");
        assert_eq!(weights, final_weights, "the final weights, resumed at {at}");
        std::fs::remove_dir_all(&again).ok();
    }
    // The control: the weights alone, without the optimizer's momentum, do not continue
    // the same run.
    let resumed = resume(&store.path_for(5), &identity(), model(&device), optimizer()).unwrap();
    let again = scratch("exact-control");
    let (_, weights) = train(&again, Some((resumed.model, optimizer(), resumed.position)));
    assert_ne!(
        weights, final_weights,
        "momentum matters, so the test can fail"
    );
    std::fs::remove_dir_all(&again).ok();
    std::fs::remove_dir_all(&dir).ok();
}

fn linear(device: &Device, seed: u64) -> Linear {
    init_module(device, seed, || LinearConfig::new(64, 32).init(device))
}

/// A store with checkpoints at steps 1..=n of a small linear model.
pub(super) fn saved(name: &str, n: usize, keep: usize) -> (PathBuf, CheckpointStore) {
    let dir = scratch(name);
    let store = CheckpointStore::new(&dir, keep);
    let device = Device::flex().autodiff();
    let saver = Checkpointer::new(store.clone(), 1, RunIdentity::new("linear").with("lr", 1));
    for step in 1..=n {
        let position = TrainPosition {
            step,
            ..TrainPosition::default()
        };
        saver
            .save_now(
                &position,
                &linear(&device, step as u64),
                &SgdConfig::new().init(),
            )
            .unwrap();
    }
    (dir, store)
}

#[test]
fn only_the_newest_k_complete_checkpoints_are_kept_and_partial_ones_never_count() {
    let (dir, store) = saved("keep", 5, 3);
    let steps: Vec<usize> = store.list().unwrap().iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, vec![3, 4, 5]);
    // A directory without a manifest (a save cut short) is not a checkpoint.
    std::fs::create_dir_all(dir.join("step-000000009")).unwrap();
    std::fs::write(dir.join("step-000000009").join(MODEL_FILE), b"half").unwrap();
    assert_eq!(store.latest().unwrap(), Some(store.path_for(5)));
    let err = CheckpointStore::load(&dir.join("step-000000009")).unwrap_err();
    assert!(matches!(err, CheckpointError::Missing { .. }), "{err}");
    // An empty or absent directory: nothing to resume, not an error.
    assert_eq!(
        CheckpointStore::new(dir.join("none"), 1).latest().unwrap(),
        None
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn corrupted_truncated_or_foreign_checkpoints_are_refused_with_the_file_named() {
    let (dir, store) = saved("corrupt", 2, 5);
    let device = Device::flex().autodiff();
    let identity = RunIdentity::new("linear").with("lr", 1);
    let path = store.path_for(2);
    let model_file = path.join(MODEL_FILE);
    let original = std::fs::read(&model_file).unwrap();
    // One flipped byte.
    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    std::fs::write(&model_file, &flipped).unwrap();
    let err = resume(
        &path,
        &identity,
        linear(&device, 0),
        SgdConfig::new().init(),
    )
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("model.bpk") && err.to_string().contains("corrupted"),
        "{err}"
    );
    // Truncated.
    std::fs::write(&model_file, &original[..original.len() / 3]).unwrap();
    let err = resume(
        &path,
        &identity,
        linear(&device, 0),
        SgdConfig::new().init(),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("truncated"), "{err}");
    std::fs::write(&model_file, &original).unwrap();
    // Another run: every difference named.
    let other = RunIdentity::new("linear big").with("lr", 2).with("seed", 7);
    let err = resume(&path, &other, linear(&device, 0), SgdConfig::new().init())
        .err()
        .unwrap();
    let message = err.to_string();
    for expected in [
        "model: checkpoint `linear`, this run `linear big`",
        "lr: checkpoint 1, this run 2",
        "seed: checkpoint (not set), this run 7",
    ] {
        assert!(message.contains(expected), "{message}");
    }
    // Weights of another architecture.
    let wide: Linear = init_module(&device, 1, || LinearConfig::new(64, 48).init(&device));
    let err = resume(&path, &identity, wide, SgdConfig::new().init())
        .err()
        .unwrap();
    assert!(err.to_string().contains("model.bpk"), "{err}");
    // A damaged manifest.
    std::fs::write(path.join("manifest.json"), b"{ not json").unwrap();
    let err = CheckpointStore::load(&path).unwrap_err();
    assert!(err.to_string().contains("manifest.json"), "{err}");
    // The intact older checkpoint still loads.
    let fine = resume(
        &store.path_for(1),
        &identity,
        linear(&device, 0),
        SgdConfig::new().init(),
    );
    assert!(fine.is_ok());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_directory_that_cannot_be_written_is_an_error_and_keeps_what_was_saved() {
    let (dir, store) = saved("unwritable", 1, 5);
    let device = Device::flex().autodiff();
    // A file where the checkpoint directory should be: no save can succeed (root ignores
    // permission bits, so a read-only directory would not do).
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"a file").unwrap();
    let saver = Checkpointer::new(
        CheckpointStore::new(&blocked, 2),
        1,
        RunIdentity::new("linear"),
    );
    let err = saver
        .save_now(
            &TrainPosition::default(),
            &linear(&device, 1),
            &SgdConfig::new().init(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("blocked"), "{err}");
    assert_eq!(store.latest().unwrap(), Some(store.path_for(1)));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn weights_and_batch_norm_statistics_round_trip_exactly() {
    let device = Device::flex().autodiff();
    let trained = model(&device);
    // A training-mode forward moves the running statistics away from their initial values.
    // Under the seed lock, as every draw in these tests: other tests' seeded models.
    let images = kiln_core::with_seed(&device, 4, || {
        burn::tensor::Tensor::<4>::random(
            [4, 3, 8, 8],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        )
    });
    let _ = kiln_core::ImageClassifier::forward_logits(&trained, images);
    let bytes = crate::model_bytes(&trained);
    let fresh = init_module(&device, 77, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(2)
            .init(&device)
    });
    assert_ne!(fingerprint(&fresh), fingerprint(&trained));
    let restored = crate::restore_model(fresh, &bytes, Path::new("model.bpk")).unwrap();
    // Compare synced values (a forward's newest statistics are held apart until synced).
    let (trained, restored) = (trained.valid(), restored.valid());
    let infos = kiln_core::param_infos(&trained);
    let a = kiln_core::read_params(&trained, &kiln_core::FlatLayout::new(infos.clone()));
    let b = kiln_core::read_params(
        &restored,
        &kiln_core::FlatLayout::new(kiln_core::param_infos(&restored)),
    );
    let first_diff = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x.to_bits() != y.to_bits());
    if let Some(i) = first_diff {
        let mut offset = 0;
        for info in &infos {
            if i < offset + info.numel() {
                panic!("{} differs (trainable {})", info.path, info.trainable);
            }
            offset += info.numel();
        }
    }
    assert_eq!(fingerprint(&restored), fingerprint(&trained));
}
