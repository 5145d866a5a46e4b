//! The last stage's loss is the objective's: a model that is not an image classifier
//! (kiln-train's segmented regression network, `Tensor<2>` in and out, its own batches, a
//! mean squared error) trains on 2 stages, GPipe and 1F1B, bit for bit like the trainer
//! accumulating the same micro-batches on one device, and within 1e-5 of the change per
//! tensor of single-device f32 training on the whole batches written out by hand (measured
//! 2.1e-6 with M = 2, 7.8e-7 with M = 4: only the order of the sums differs); a different
//! loss misses by far. Two data-parallel pipelines of two stages: within 1e-5 too (measured
//! 8.0e-7). Plus validation for the objective, bf16, and a batch that cannot be cut.

use std::collections::HashMap;

use burn::tensor::{Device, Tensor};
use kiln_amp::{MixedPrecision, Precision};
use kiln_data::{BatchSource, cut_batch};
use kiln_test_support::change_error;
use kiln_train::testing::{
    Mse, RegressionNet, Rows, by_path, reference, regression_batches, sgd, source,
};
use kiln_train::{LocalStep, LrSchedule, Trainer};

use crate::schedule::ScheduleKind;
use crate::{Pipeline, PipelineConfig, PipelineError, PipelineReport};

const SEED: u64 = 5;
const BATCHES: usize = 2;
const SIZE: usize = 16;
const STEPS: usize = 4;
const LR: f64 = 0.05;
/// The same samples' gradients, summed in the same order or in an order that rounds alike.
const TOLERANCE: f32 = kiln_test_support::tolerance::SAME_ORDER;

fn build(device: &Device) -> RegressionNet {
    RegressionNet::new(device, SEED)
}

/// Trains on 2 CPU stages for `objective`, validating after every epoch.
fn pipeline(
    config: PipelineConfig,
    objective: Mse,
    mut batches: impl BatchSource<Batch = Rows>,
) -> Result<PipelineReport, PipelineError> {
    let valid = source(regression_batches(1, 8, &Device::flex()), &Device::flex());
    Pipeline::with_objective(vec![Device::flex(); 2], objective)
        .config(config)
        .valid_loader(valid)
        .train(build, sgd, &LrSchedule::constant(LR), &mut batches, STEPS)
}

fn config(schedule: ScheduleKind, micro_batches: usize) -> PipelineConfig {
    PipelineConfig {
        schedule,
        micro_batches,
        ..PipelineConfig::default()
    }
}

fn whole_batches() -> Vec<Rows> {
    regression_batches(BATCHES, SIZE, &Device::flex().autodiff())
}

/// One device accumulating `micro` micro-batches of every batch per step.
fn accumulating(micro: usize) -> HashMap<String, Vec<f32>> {
    let device = Device::flex().autodiff();
    let micro_batches: Vec<Rows> = whole_batches()
        .iter()
        .flat_map(|batch| cut_batch(batch, micro).unwrap())
        .collect();
    let (model, _) = Trainer::with_objective(build(&device), sgd(), Mse::default())
        .gradient_step(LocalStep::with_objective(Mse::default()))
        .schedule(LrSchedule::constant(LR))
        .train_loader(source(micro_batches, &device))
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

#[test]
fn two_stages_train_a_regression_model_like_one_device() {
    let device = Device::flex().autodiff();
    let start = by_path(&build(&device));
    let want = reference(SEED, &whole_batches(), STEPS, LR);
    for micro in [2, 4] {
        let accumulated = accumulating(micro);
        for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
            let report = pipeline(
                config(kind, micro),
                Mse::default(),
                source(whole_batches(), &device),
            )
            .unwrap_or_else(|err| panic!("{kind} M={micro}: {err}"));
            assert_eq!(
                report.params, accumulated,
                "{kind} M={micro}: bit for bit the trainer accumulating the micro-batches"
            );
            let error = change_error(&start, &want, &report.params);
            println!("pipeline {kind} M={micro}: {error:e}");
            assert!(
                error <= TOLERANCE,
                "{kind} M={micro}: relative error {error:e}"
            );
            assert_eq!(report.epochs.len(), STEPS / BATCHES, "{kind}: every epoch");
            assert!(
                report
                    .epochs
                    .iter()
                    .all(|e| e.valid_loss.is_some_and(f32::is_finite)),
                "{kind}: validated for the objective: {:?}",
                report.epochs
            );
        }
    }
    // The control: the pipeline trained for another loss (× 1.01) fails the comparison.
    let other = pipeline(
        config(ScheduleKind::OneFOneB, 2),
        Mse { scale: 1.01 },
        source(whole_batches(), &device),
    )
    .unwrap();
    let error = change_error(&start, &want, &other.params);
    println!("pipeline, loss x 1.01 (control): {error:e}");
    assert!(error > TOLERANCE, "the control passed: {error:e}");
}

#[test]
fn data_parallel_pipelines_train_the_objective_like_one_device() {
    // D = 2 pipelines of 2 stages: a step takes two consecutive batches, one per pipeline;
    // one device trains on both joined. The stage copies' all-reduce adds in another order.
    let device = Device::flex().autodiff();
    let batches = regression_batches(2 * BATCHES, SIZE, &device);
    let joined: Vec<Rows> = batches
        .chunks(2)
        .map(|pair| Rows {
            features: Tensor::cat(pair.iter().map(|b| b.features.clone()).collect(), 0),
            targets: Tensor::cat(pair.iter().map(|b| b.targets.clone()).collect(), 0),
        })
        .collect();
    let start = by_path(&build(&device));
    let want = reference(SEED, &joined, STEPS, LR);
    let config = PipelineConfig {
        data_parallel: 2,
        ..config(ScheduleKind::GPipe, 2)
    };
    let report = Pipeline::with_objective(vec![Device::flex(); 4], Mse::default())
        .config(config)
        .train(
            build,
            sgd,
            &LrSchedule::constant(LR),
            &mut source(batches, &device),
            STEPS,
        )
        .expect("2 x 2 stages");
    let error = change_error(&start, &want, &report.params);
    println!("pipeline D=2 x P=2: {error:e}");
    assert!(error <= TOLERANCE, "relative error of the change {error:e}");
}

#[test]
fn the_objective_trains_in_bf16_across_stages() {
    let device = Device::flex().autodiff();
    let config = PipelineConfig {
        precision: MixedPrecision::new(Precision::Bf16),
        ..config(ScheduleKind::OneFOneB, 2)
    };
    let report = pipeline(config, Mse::default(), source(whole_batches(), &device))
        .expect("bf16 casts the objective's input and output");
    assert!(
        report.losses.iter().all(|l| l.is_finite()),
        "{:?}",
        report.losses
    );
}

#[test]
fn a_batch_too_small_for_the_micro_batches_is_a_clear_error() {
    let device = Device::flex().autodiff();
    let small = source(regression_batches(BATCHES, 3, &device), &device);
    let err = pipeline(config(ScheduleKind::GPipe, 4), Mse::default(), small)
        .expect_err("3 samples, 4 micro-batches");
    assert!(
        matches!(&err, PipelineError::Config(message) if message.contains("a batch of 3 samples cannot be cut into 4 micro-batches")),
        "{err}"
    );
}
