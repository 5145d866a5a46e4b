//! A transformer language model through the pipeline: token ids enter the first stage, the
//! last scores its logits against the next tokens. An untied GPT on 2 stages (1F1B, and
//! interleaved with 2 chunks a stage) trains like one device accumulating the same
//! micro-batches of the same text windows (measured: bit for bit; a 1 % larger learning rate, the
//! control, 1.5e-2). A tied one split across stages is refused, saying
//! why, before any step.

use std::collections::HashMap;

use burn::tensor::Device;
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

#[test]
fn a_tied_gpt_split_across_stages_is_refused_saying_why() {
    let tied = |device: &Device| {
        kiln_core::init_module(device, 21, || {
            GptConfig::new(256, CONTEXT, 4, 2, 16).init(device)
        })
    };
    let config = PipelineConfig {
        micro_batches: MICRO,
        ..PipelineConfig::default()
    };
    let err = Pipeline::with_objective(vec![Device::flex(); 2], LanguageModeling)
        .config(config)
        .progress(false)
        .train(
            tied,
            sgd,
            &LrSchedule::constant(LR),
            &mut windows(BATCH),
            STEPS,
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "ties a parameter of its Input segment (stage 0) to its Output segment (stage 1)"
        ),
        "{text}"
    );
}
