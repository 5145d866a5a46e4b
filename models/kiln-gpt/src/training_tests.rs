//! The model learns: a small GPT trained on the shipped Jargon File for a few hundred steps
//! on one CPU device reaches a held-out loss below the unigram baseline (what always
//! predicting the text's byte frequencies scores).

use burn::optim::AdamWConfig;
use burn::tensor::Device;
use kiln_data::{TextCorpus, TextWindows};
use kiln_train::{LanguageModeling, LrSchedule, Trainer};

use crate::GptConfig;

#[test]
fn a_small_gpt_beats_the_unigram_baseline_on_held_out_text() {
    const CONTEXT: usize = 32;
    let (train, held_out) = TextCorpus::jargon_file().split(0.05).unwrap();
    let baseline = held_out.unigram_loss();
    let device = Device::flex().autodiff();
    let model = kiln_core::init_module(&device, 3, || {
        GptConfig::new(256, CONTEXT, 2, 2, 64).init(&device)
    });
    let windows = TextWindows::builder(train)
        .context(CONTEXT)
        .batch_size(16)
        .seed(1)
        .device(device.clone())
        .build()
        .unwrap();
    let valid = TextWindows::builder(held_out)
        .context(CONTEXT)
        .batch_size(64)
        .sequential()
        .device(Device::flex())
        .build()
        .unwrap();
    let (_, report) = Trainer::with_objective(model, AdamWConfig::new().init(), LanguageModeling)
        .schedule(LrSchedule::constant(3e-3).warmup(20))
        .train_loader(windows)
        .valid_loader(valid)
        .max_steps(250)
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap()
        .fit()
        .unwrap();
    let held_out_loss = f64::from(report.epochs.last().unwrap().valid_loss.unwrap());
    assert!(
        held_out_loss < baseline - 0.2,
        "held-out loss {held_out_loss:.3} vs the unigram baseline {baseline:.3}"
    );
    eprintln!("held-out loss {held_out_loss:.3}, unigram baseline {baseline:.3}");
}
