//! Gradient accumulation (one flush over every accumulated micro-batch) and the divergence
//! check of data-parallel pipelines, and the injected fault.

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::Device;
use kiln_resnet::ResNet;
use kiln_train::{LrSchedule, Trainer};

use kiln_test_support::change_error;

use crate::runtime::test_support::{by_path, fit_quietly, resnet, sgd, shuffled};

use crate::schedule::ScheduleKind;
use crate::{Pipeline, PipelineConfig, PipelineError};

/// Relative error allowed on parameter changes against one device (as the pipeline's other
/// equivalence tests).
const TOLERANCE: f32 = kiln_test_support::tolerance::SAME_ORDER;

fn build(device: &Device) -> ResNet {
    resnet(device, 17)
}

#[test]
fn accumulating_k_batches_is_one_flush_like_one_device_accumulating_every_micro_batch() {
    // 3 steps of 2 accumulated batches of 12, each cut into 2 micro-batches of 6.
    let (model, _) = fit_quietly(
        Trainer::builder(build(&Device::flex().autodiff()), sgd())
            .schedule(LrSchedule::constant(0.1))
            .train_loader(shuffled(6))
            .accumulation_steps(4)
            .max_steps(3),
    );
    let want = by_path(&model);
    let config = PipelineConfig {
        schedule: ScheduleKind::OneFOneB,
        micro_batches: 2,
        accumulation: 2,
        ..PipelineConfig::default()
    };
    let report = Pipeline::new(vec![Device::flex(); 2])
        .config(config)
        .train(build, sgd, &LrSchedule::constant(0.1), &mut shuffled(12), 3)
        .unwrap();
    // Measured here: equal bit for bit (the sums run in the same order); other CPUs may
    // round a stage's kernels differently.
    let start = by_path(&build(&Device::flex().autodiff()));
    let error = change_error(&start, &want, &report.params);
    assert!(
        error <= TOLERANCE,
        "accumulating pipeline against one device: {error:e}"
    );
    // One flush of 4 micro-batches on 2 stages: 1F1B holds at most 2 on stage 0.
    assert!(report.stages[0].peak_in_flight <= 2);
    // The control: without accumulation each step takes half the samples.
    let plain = Pipeline::new(vec![Device::flex(); 2])
        .config(PipelineConfig {
            micro_batches: 2,
            ..PipelineConfig::default()
        })
        .train(build, sgd, &LrSchedule::constant(0.1), &mut shuffled(12), 3)
        .unwrap();
    let control = change_error(&start, &want, &plain.params);
    assert!(control > 100.0 * TOLERANCE, "control: {control:e}");
    let refused = Pipeline::new(vec![Device::flex(); 2])
        .config(PipelineConfig {
            accumulation: 0,
            ..PipelineConfig::default()
        })
        .train(build, sgd, &LrSchedule::constant(0.1), &mut shuffled(12), 1)
        .unwrap_err();
    assert!(refused.to_string().contains("accumulation"), "{refused}");
}

#[test]
fn data_parallel_copies_that_differ_are_caught_by_the_divergence_check() {
    let config = PipelineConfig {
        micro_batches: 2,
        data_parallel: 2,
        check_every: 1,
        ..PipelineConfig::default()
    };
    // Identical copies pass the check after every step.
    Pipeline::new(vec![Device::flex(); 4])
        .config(config.clone())
        .train(build, sgd, &LrSchedule::constant(0.1), &mut shuffled(12), 2)
        .unwrap();
    // One of the four stage threads builds its copy from another seed.
    let calls = AtomicUsize::new(0);
    let odd = |device: &Device| {
        let seed = if calls.fetch_add(1, Ordering::SeqCst) == 2 {
            18
        } else {
            17
        };
        resnet(device, seed)
    };
    let err = Pipeline::new(vec![Device::flex(); 4])
        .config(config)
        .train(odd, sgd, &LrSchedule::constant(0.1), &mut shuffled(12), 2)
        .unwrap_err();
    assert!(
        matches!(err, PipelineError::Diverged { step: 0, .. }),
        "{err}"
    );
}

#[test]
fn an_injected_fault_fails_the_last_stage_at_its_step_and_no_other() {
    let config = |step| PipelineConfig {
        micro_batches: 2,
        panic_at_step: Some(step),
        timeout: std::time::Duration::from_secs(60),
        ..PipelineConfig::default()
    };
    let run = |step| {
        Pipeline::new(vec![Device::flex(); 2])
            .config(config(step))
            .train(build, sgd, &LrSchedule::constant(0.1), &mut shuffled(12), 2)
    };
    let err = run(1).expect_err("the fault fails the run");
    assert!(
        matches!(&err, PipelineError::Stage { stage: 1, message } if message.contains("injected fault at step 1")),
        "{err}"
    );
    // A step the run never takes: no fault.
    assert_eq!(run(5).unwrap().losses.len(), 2);
}
