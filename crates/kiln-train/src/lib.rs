//! kiln's training loop.
//!
//! A [`Trainer`] (built with [`Trainer::builder`]) runs epochs or a fixed number of steps of
//! an [`ImageClassifier`](kiln_core::ImageClassifier) with any of Burn's optimisers, a
//! [`LrSchedule`], and reports loss, accuracy and images/s per step, live on a progress bar
//! and as a summary per epoch. Any other model ([`kiln_core::Forward`]) trains the same way
//! on its own batches ([`kiln_data::BatchSource`]) for its own loss: give an [`Objective`]
//! to [`Trainer::with_objective`] (the example on [`Objective`]). How gradients are produced is a [`GradientStep`]: on one
//! device it is a plain forward and backward ([`LocalStep`], in f32 or mixed precision); the data-parallel runtime plugs
//! in a step that also all-reduces gradients, without changing the loop. A program's step
//! flags (`--amp`, `--clip-grad-norm`, `--accumulation`, `--check-every`, `--threads`) are
//! [`StepOptions`] (clap arguments with the `clap` feature).
//!
//! ```
//! use burn::optim::SgdConfig;
//! use burn::tensor::Device;
//! use kiln_data::{DataLoader, SyntheticImages};
//! use kiln_resnet::{ResNetConfig, StemKind};
//! use kiln_train::{LrSchedule, Trainer};
//!
//! let device = Device::flex().autodiff();
//! let model = kiln_core::init_module(&device, 42, || {
//!     ResNetConfig::resnet18(4).with_stem(StemKind::Cifar).with_base_width(2).init(&device)
//! });
//! let data = SyntheticImages::new(16, 4, 1, [3, 8, 8]);
//! let loader = DataLoader::builder(data).batch_size(8).device(device.clone()).build();
//! let trainer = Trainer::builder(model, SgdConfig::new().init())
//!     .schedule(LrSchedule::constant(0.05))
//!     .train_loader(loader)
//!     .max_steps(2)
//!     .progress(false)
//!     .build()
//!     .unwrap();
//! let (_model, report) = trainer.fit().unwrap();
//! assert_eq!(report.steps.len(), 2);
//! ```
#![warn(missing_docs)]

mod accumulate;
mod engine;
mod error;
mod evaluate;
mod fault;
mod language_modeling;
mod mean_gradient;
mod metrics;
mod objective;
pub mod plot;
mod progress;
mod replica_engine;
mod resume;
mod run_log;
#[cfg(test)]
mod run_log_tests;
mod schedule;
mod startup;
mod steady_mark;
mod step;
mod step_options;
mod stop;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod throughput;
mod train_loop;
mod trainer;

pub use engine::{EngineStep, StepEngine};
pub use error::{CheckpointCause, TrainError};
pub use evaluate::{Evaluation, evaluate, evaluate_with};
pub use fault::{FaultyStep, InjectedFault};
pub use language_modeling::LanguageModeling;
pub use mean_gradient::{GradientSummary, GradientValues, MeanGradient};
pub use metrics::{EpochSummary, FirstStep, StepRecord, TrainReport};
pub use objective::{
    Classification, Objective, Reporting, classification_loss, count_correct, objective_loss,
};
pub use resume::{CheckpointHook, TrainPosition};
pub use run_log::{RunLog, TrainObserver};
pub use schedule::{Decay, LrScaling, LrSchedule, linear_scaled_lr};
pub use startup::{StartupCost, is_out_of_memory, out_of_memory_hint};
pub use steady_mark::SteadyStateMark;
pub use step::{
    GradientStep, LocalStep, StepMetrics, StepOutput, StepState, forward_backward,
    forward_backward_with,
};
pub use step_options::{StepOptions, positive_count, positive_rate};
pub use stop::StopFlag;
pub use throughput::measure_throughput;
pub use train_loop::{Budget, LoopOptions, train_loop};
pub use trainer::{Trainer, TrainerBuilder};

#[cfg(test)]
mod objective_tests;
#[cfg(test)]
mod precision_tests;
#[cfg(test)]
mod tests;
