//! The trainer is deterministic and actually learns.

use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::Device;
use kiln_core::{FlatLayout, init_module, param_infos, read_params};
use kiln_data::{DataLoader, SyntheticImages};
use kiln_resnet::{ResNetConfig, StemKind};

use crate::{LrSchedule, TrainError, TrainReport, Trainer};

fn run(workers: usize, steps: usize) -> TrainReport {
    let device = Device::flex().autodiff();
    let model = init_module(&device, 5, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(4)
            .init(&device)
    });
    let data = SyntheticImages::new(256, 4, 2, [3, 8, 8]).with_noise(0.5);
    let valid = data.split(64, 9);
    let optimizer = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init();
    let trainer = Trainer::builder(model, optimizer)
        .schedule(LrSchedule::constant(0.05).warmup(3).cosine(steps, 0.0))
        .train_loader(
            DataLoader::builder(data)
                .batch_size(32)
                .num_workers(workers)
                .shuffle(1)
                .device(device.clone())
                .build(),
        )
        .valid_loader(DataLoader::builder(valid).batch_size(64).build())
        .max_steps(steps)
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap();
    trainer.fit().unwrap().1
}

#[test]
fn two_runs_with_one_seed_give_identical_losses_and_learn() {
    let first = run(0, 24);
    let second = run(2, 24);
    assert_eq!(
        first.losses(),
        second.losses(),
        "same seed, same losses, whatever the worker count"
    );
    assert_eq!(first.steps.len(), 24);
    assert_eq!(first.epochs.len(), 3, "24 steps of 8 per epoch");
    let early: f32 = first.losses()[..4].iter().sum::<f32>() / 4.0;
    let late: f32 = first.losses()[20..].iter().sum::<f32>() / 4.0;
    assert!(late < 0.7 * early, "loss should fall: {early} -> {late}");
    assert!(
        first.final_valid_accuracy().unwrap() > 0.5,
        "{:?}",
        first.epochs.last()
    );
}

#[test]
fn a_loader_on_a_plain_device_is_rejected_with_a_clear_error() {
    let device = Device::flex();
    let model = ResNetConfig::resnet18(2)
        .with_stem(StemKind::Cifar)
        .with_base_width(2)
        .init(&device);
    let result = Trainer::builder(model, SgdConfig::new().init())
        .train_loader(DataLoader::builder(SyntheticImages::new(8, 2, 1, [3, 4, 4])).build())
        .build();
    assert!(matches!(result, Err(TrainError::Config(msg)) if msg.contains("autodiff")));
}

#[test]
fn zero_epochs_steps_or_micro_batches_are_refused_with_the_option_named() {
    let device = Device::flex().autodiff();
    let builder = || {
        let model = kiln_core::init_module(&device, 1, || {
            ResNetConfig::resnet18(2)
                .with_stem(StemKind::Cifar)
                .with_base_width(2)
                .init(&device)
        });
        Trainer::builder(model, SgdConfig::new().init()).train_loader(
            DataLoader::builder(SyntheticImages::new(8, 2, 1, [3, 4, 4]))
                .batch_size(2)
                .device(device.clone())
                .build(),
        )
    };
    for (result, option) in [
        (builder().epochs(0).build().map(|_| ()), "epochs"),
        (builder().max_steps(0).build().map(|_| ()), "max_steps"),
        (
            builder().accumulation_steps(0).build().map(|_| ()),
            "accumulation_steps",
        ),
    ] {
        assert!(
            matches!(&result, Err(TrainError::Config(msg)) if msg.contains(option)),
            "{option}: {:?}",
            result.err()
        );
    }
    assert!(builder().epochs(1).accumulation_steps(2).build().is_ok());
}

/// Each trainable tensor's values, by path.
fn trainable<M: burn::module::Module>(model: &M) -> Vec<(String, Vec<f32>)> {
    let infos = param_infos(model);
    let layout = FlatLayout::new(infos.clone());
    let flat = read_params(model, &layout);
    layout
        .entries()
        .iter()
        .filter(|e| e.info.trainable)
        .map(|e| {
            (
                e.info.path.clone(),
                flat[e.offset..e.offset + e.info.numel()].to_vec(),
            )
        })
        .collect()
}

#[test]
fn adamw_with_step_decay_trains_through_the_same_builder() {
    let device = Device::flex().autodiff();
    let model = init_module(&device, 5, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(2)
            .init(&device)
    });
    let before = trainable(&model);
    let data = SyntheticImages::new(64, 4, 2, [3, 8, 8]).with_noise(0.5);
    let (model, report) = Trainer::builder(model, burn::optim::AdamWConfig::new().init())
        .schedule(LrSchedule::constant(1e-2).step_decay(2, 0.5))
        .train_loader(
            DataLoader::builder(data)
                .batch_size(16)
                .device(device.clone())
                .build(),
        )
        .max_steps(6)
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap()
        .fit()
        .unwrap();
    let rates: Vec<f64> = report.steps.iter().map(|s| s.lr).collect();
    assert_eq!(rates, vec![1e-2, 1e-2, 5e-3, 5e-3, 2.5e-3, 2.5e-3]);
    // Every trainable tensor moved by an Adam-sized step: its first update alone moves each
    // element by about the learning rate (1e-2), whatever the gradient's scale.
    let after = trainable(&model);
    assert_eq!(after.len(), before.len());
    for ((path, old), (_, new)) in before.iter().zip(&after) {
        let moved = old
            .iter()
            .zip(new)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(moved > 5e-3, "{path} moved only {moved:e}");
    }
    // Four batches per epoch, unshuffled: steps 4 and 5 see the batches of steps 0 and 1
    // again, and the loss on them fell.
    let losses = report.losses();
    assert!(losses.iter().all(|l| l.is_finite()));
    for (first, again) in [(0, 4), (1, 5)] {
        assert!(
            losses[again] < 0.9 * losses[first],
            "same batch, step {first} -> {again}: {losses:?}"
        );
    }
}
