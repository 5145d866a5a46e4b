//! A transformer language model through the pipeline: token ids enter the first stage, the
//! last scores its logits against the next tokens. An untied GPT on 2 stages (1F1B, and
//! interleaved with 2 chunks a stage) trains like one device accumulating the same
//! micro-batches of the same text windows (measured: bit for bit; a 1 % larger learning rate, the
//! control, 1.5e-2). A tied one (the head reads the token embedding) on 2 and 3 stages,
//! 1F1B and interleaved, its last stage holding a copy of the embedding whose gradient the
//! stages sum every step, trains like one device too; without the sum (the control) the
//! copies part at once. Its checkpoints hold the embedding once and resume bit for bit.

use std::collections::HashMap;
use std::path::PathBuf;

use burn::tensor::Device;
use kiln_checkpoint::{CheckpointStore, Checkpointer, RunIdentity};
use kiln_data::TextWindows;
use kiln_gpt::{Gpt, GptConfig};
use kiln_test_support::change_error;
use kiln_test_support::tolerance::SAME_ORDER;
use kiln_train::testing::jargon_windows;
use kiln_train::{LanguageModeling, LocalStep, LrSchedule, Trainer};

use crate::runtime::test_support::{by_path, sgd};
use crate::schedule::ScheduleKind;
use crate::{Pipeline, PipelineConfig};

const CONTEXT: usize = 16;
const BATCH: usize = 8;
const MICRO: usize = 4;
const STEPS: usize = 3;
const LR: f64 = 0.05;

fn build(device: &Device) -> Gpt {
    kiln_core::init_module(device, 21, || {
        GptConfig::new(256, CONTEXT, 4, 2, 16)
            .with_tied(false)
            .init(device)
    })
}

/// `batch` windows a step of the Jargon File's head, seeded, on the training device.
fn windows(batch: usize) -> TextWindows {
    jargon_windows((CONTEXT, batch), (0, 1), 5, &Device::flex().autodiff())
}

/// One device accumulating `MICRO` batches of `BATCH / MICRO` windows a step: the same
/// windows, in the same order, as the pipeline's micro-batches.
fn one_device(lr: f64) -> HashMap<String, Vec<f32>> {
    let device = Device::flex().autodiff();
    let (model, _) = Trainer::with_objective(build(&device), sgd(), LanguageModeling)
        .gradient_step(LocalStep::with_objective(LanguageModeling))
        .schedule(LrSchedule::constant(lr))
        .train_loader(windows(BATCH / MICRO))
        .accumulation_steps(MICRO)
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
fn an_untied_gpt_trains_in_stages_like_one_device() {
    let start = by_path(&build(&Device::flex().autodiff()));
    let want = one_device(LR);
    for schedule in [
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved { virtual_stages: 2 },
    ] {
        let config = PipelineConfig {
            schedule,
            micro_batches: MICRO,
            ..PipelineConfig::default()
        };
        let report = Pipeline::with_objective(vec![Device::flex(); 2], LanguageModeling)
            .config(config)
            .progress(false)
            .train(
                build,
                sgd,
                &LrSchedule::constant(LR),
                &mut windows(BATCH),
                STEPS,
            )
            .unwrap();
        let error = change_error(&start, &want, &report.params);
        eprintln!("{schedule}: relative error of the change {error:e}");
        assert!(
            error <= SAME_ORDER,
            "{schedule}: relative error of the change {error:e}"
        );
        assert!(
            report.losses[0] > 5.0,
            "an untrained byte model: {:?}",
            report.losses
        );
    }
    // The control: a 1 % larger learning rate on one device.
    let control = change_error(&start, &want, &one_device(LR * 1.01));
    eprintln!("the control (lr x 1.01): {control:e}");
    assert!(
        control > 10.0 * SAME_ORDER,
        "the control passed: {control:e}"
    );
}

/// A tied GPT (the head reads the token embedding) on the same seeded weights.
fn build_tied(device: &Device) -> Gpt {
    kiln_core::init_module(device, 21, || {
        GptConfig::new(256, CONTEXT, 4, 2, 16).init(device)
    })
}

/// One device accumulating `micro` micro-batches of `BATCH / MICRO` windows a step, tied.
fn one_device_tied(micro: usize) -> HashMap<String, Vec<f32>> {
    let device = Device::flex().autodiff();
    let (model, _) = Trainer::with_objective(build_tied(&device), sgd(), LanguageModeling)
        .gradient_step(LocalStep::with_objective(LanguageModeling))
        .schedule(LrSchedule::constant(LR))
        .train_loader(windows(BATCH / MICRO))
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

/// `copies` data-parallel pipelines of a tied GPT on `stages` stages (`schedule`, `micro`
/// micro-batches of `BATCH / MICRO` windows), its stages comparing their copies of the
/// embedding after every step; `sum_off`: the control, without the stages' gradient sum.
fn tied_pipeline(
    (stages, schedule, micro, copies): (usize, ScheduleKind, usize, usize),
    sum_off: bool,
    checkpoints: Option<(Checkpointer, Option<PathBuf>)>,
) -> Result<crate::PipelineReport, crate::PipelineError> {
    let config = PipelineConfig {
        schedule,
        micro_batches: micro,
        data_parallel: copies,
        check_every: 1,
        tied_sum_off: sum_off,
        ..PipelineConfig::default()
    };
    let devices = vec![Device::flex(); stages * copies];
    let mut pipeline = Pipeline::with_objective(devices, LanguageModeling)
        .config(config)
        .progress(false);
    if let Some((saver, from)) = checkpoints {
        pipeline = pipeline.checkpoint(saver);
        if let Some(from) = from {
            pipeline = pipeline.resume(from, identity());
        }
    }
    pipeline.train(
        build_tied,
        sgd,
        &LrSchedule::constant(LR),
        &mut windows(micro * BATCH / MICRO),
        STEPS,
    )
}

/// The stages add the embedding's two gradient shares (the first stage's, the last's) after
/// summing each over the micro-batches, where one device adds them per micro-batch: the
/// same sums in another order (measured: 2.2e-6 on 2 and 3 stages, 3.7e-6 on 3 interleaved
/// with 6 micro-batches, 3.0e-6 on 2 x 2; the control without the stages' sum, 1.0).
const TIED_TOLERANCE: f32 = kiln_test_support::tolerance::REORDERED;

#[test]
fn a_tied_gpt_trains_across_stages_like_one_device_its_stages_summing_the_shared_gradient() {
    let start = by_path(&build_tied(&Device::flex().autodiff()));
    let want = one_device_tied(MICRO);
    let interleaved = ScheduleKind::Interleaved { virtual_stages: 2 };
    for (stages, schedule, micro, copies) in [
        (2, ScheduleKind::OneFOneB, MICRO, 1),
        (2, interleaved, MICRO, 1),
        (3, ScheduleKind::OneFOneB, MICRO, 1),
        // Interleaving takes a multiple of the stages in micro-batches.
        (3, interleaved, 6, 1),
        // Two pipelines: each stage's copies add theirs first, then the stages sum.
        (2, ScheduleKind::OneFOneB, MICRO, 2),
    ] {
        let want = if micro * copies == MICRO {
            want.clone()
        } else {
            one_device_tied(micro * copies)
        };
        let report = tied_pipeline((stages, schedule, micro, copies), false, None).unwrap();
        let error = change_error(&start, &want, &report.params);
        let plan = format!("{copies} x {stages} stages, {schedule}");
        eprintln!("tied, {plan}: relative error of the change {error:e}");
        assert!(
            error <= TIED_TOLERANCE,
            "tied, {plan}: relative error of the change {error:e}"
        );
    }
    // The control: the stages do not sum the shared gradient; each copy follows its own
    // share, and the stages' check finds the copies apart after the first step.
    let err = tied_pipeline((2, ScheduleKind::OneFOneB, MICRO, 1), true, None).unwrap_err();
    assert!(
        matches!(err, crate::PipelineError::TiedDiverged { step: 0 }),
        "{err}"
    );
    let config = PipelineConfig {
        micro_batches: MICRO,
        tied_sum_off: true,
        ..PipelineConfig::default()
    };
    let control = Pipeline::with_objective(vec![Device::flex(); 2], LanguageModeling)
        .config(config)
        .progress(false)
        .train(
            build_tied,
            sgd,
            &LrSchedule::constant(LR),
            &mut windows(BATCH),
            STEPS,
        )
        .unwrap();
    let error = change_error(&start, &want, &control.params);
    eprintln!("the control (no sum between the stages): {error:e}");
    assert!(
        error > 100.0 * TIED_TOLERANCE,
        "the control passed: {error:e}"
    );
}

fn identity() -> RunIdentity {
    RunIdentity::new("tied gpt").with("windows per step", BATCH)
}

#[test]
fn a_tied_pipeline_saves_the_shared_weight_once_and_resumes_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("kiln-pipe-tied-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let saver = || Checkpointer::new(CheckpointStore::new(&dir, 10), 1, identity());
    let plan = (2, ScheduleKind::OneFOneB, MICRO, 1);
    let whole = tied_pipeline(plan, false, Some((saver(), None))).unwrap();
    let store = CheckpointStore::new(&dir, 10);
    let at = store.path_for(1);
    // Joining the stages' modules refuses a tensor two parts hold whole: the copy is not in
    // the last stage's part, and the manifest's ids name the embedding once.
    let ids = std::fs::read_to_string(at.join("param_ids.json")).unwrap();
    assert_eq!(ids.matches("\"token.weight\"").count(), 1, "{ids}");
    let again = std::env::temp_dir().join(format!("kiln-pipe-tied-again-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&again);
    let resumed = tied_pipeline(
        plan,
        false,
        Some((
            Checkpointer::new(CheckpointStore::new(&again, 10), 1, identity()),
            Some(at),
        )),
    )
    .unwrap();
    assert_eq!(resumed.losses, whole.losses[1..], "losses after step 1");
    assert_eq!(resumed.params, whole.params, "weights, resumed at step 1");
    for d in [dir, again] {
        std::fs::remove_dir_all(&d).ok();
    }
}
