//! The training loop.

use std::time::Instant;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use kiln_core::{Forward, ImageClassifier};
use kiln_data::BatchSource;

use crate::evaluate::evaluate_with;
use crate::metrics::{EpochSummary, FirstStep, StepRecord, TrainReport};
use crate::progress::epoch_bar;
use crate::{
    CheckpointHook, Classification, GradientStep, LocalStep, LrSchedule, Objective, StopFlag,
    TrainError, TrainObserver, TrainPosition,
};

/// Where a trainer reads batches of `B` from: any [`BatchSource`], boxed so that the
/// builder's type does not name it.
type Source<B> = Box<dyn BatchSource<Batch = B>>;

/// How long to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    Epochs(usize),
    Steps(usize),
}

/// What a builder sets and the trainer keeps, besides the model, optimizer, step and data.
struct Settings<O: Objective> {
    schedule: LrSchedule,
    budget: Budget,
    accumulation: usize,
    valid: Option<Source<O::Batch>>,
    /// Scores validation batches (the objective the step trains for).
    objective: O,
    progress: bool,
    log_epochs: bool,
}

/// Configures a [`Trainer`]; see the crate docs for an example.
///
/// `O` is the [`Objective`] (the batches it reads and the validation loss); the gradient
/// step `S` must train for the same one ([`Classification`] by default).
pub struct TrainerBuilder<M, S = LocalStep, O: Objective = Classification> {
    model: M,
    optimizer: ModuleOptimizer,
    step: S,
    train: Option<Source<O::Batch>>,
    settings: Settings<O>,
    checkpoint: Option<Box<dyn CheckpointHook<M>>>,
    observers: Vec<Box<dyn TrainObserver>>,
    stop: Option<StopFlag>,
    start: TrainPosition,
}

impl<M: Module, O: Objective> TrainerBuilder<M, LocalStep<O>, O> {
    pub(crate) fn new(model: M, optimizer: ModuleOptimizer, objective: O) -> Self {
        Self {
            model,
            optimizer,
            step: LocalStep::with_objective(objective.clone()),
            train: None,
            checkpoint: None,
            observers: Vec::new(),
            stop: None,
            start: TrainPosition::default(),
            settings: Settings {
                schedule: LrSchedule::constant(0.01),
                budget: Budget::Epochs(1),
                accumulation: 1,
                valid: None,
                objective,
                progress: true,
                log_epochs: true,
            },
        }
    }
}

impl<M: Module, S: GradientStep<M, O::Batch>, O: Objective> TrainerBuilder<M, S, O> {
    /// How gradients are produced (default: [`LocalStep`], one device). It must train for
    /// the builder's objective (e.g. `replica.overlapped_step_with(objective)` for a
    /// data-parallel replica), whose batches it takes.
    pub fn gradient_step<T: GradientStep<M, O::Batch>>(self, step: T) -> TrainerBuilder<M, T, O> {
        TrainerBuilder {
            model: self.model,
            optimizer: self.optimizer,
            step,
            train: self.train,
            settings: self.settings,
            checkpoint: self.checkpoint,
            observers: self.observers,
            stop: self.stop,
            start: self.start,
        }
    }

    /// Stops training after the step during which `flag` is raised (every replica at the
    /// same step: they agree through the gradient step), saving a checkpoint there when a
    /// [`checkpoint`](Self::checkpoint) hook is set. The report says so
    /// ([`TrainReport::stopped_at`](crate::TrainReport::stopped_at)).
    pub fn stop_flag(mut self, flag: StopFlag) -> Self {
        self.stop = Some(flag);
        self
    }

    /// Shows `observer` every step and epoch as it is recorded (e.g. a [`RunLog`](crate::RunLog)
    /// writing a run directory's metrics and curves). Several may be added: each sees every
    /// record, in the order they were added.
    pub fn observer(mut self, observer: impl TrainObserver + 'static) -> Self {
        self.observers.push(Box::new(observer));
        self
    }

    /// Saves checkpoints through `hook` after optimizer steps (when it says so).
    pub fn checkpoint(mut self, hook: impl CheckpointHook<M> + 'static) -> Self {
        self.checkpoint = Some(Box::new(hook));
        self
    }

    /// Starts at `position` instead of the beginning: the model and the optimizer given to
    /// the builder must hold the state saved there. The loader continues the epoch with the
    /// batches not yet seen, and the schedule at the step's rate, so the run continues as
    /// if it had never stopped.
    pub fn resume_at(mut self, position: TrainPosition) -> Self {
        self.start = position;
        self
    }

    /// The learning-rate schedule (default: constant 0.01).
    pub fn schedule(mut self, schedule: LrSchedule) -> Self {
        self.settings.schedule = schedule;
        self
    }

    /// Trains for `epochs` full epochs (the default is one).
    pub fn epochs(mut self, epochs: usize) -> Self {
        self.settings.budget = Budget::Epochs(epochs);
        self
    }

    /// Trains for exactly `steps` steps, across as many epochs as that takes.
    pub fn max_steps(mut self, steps: usize) -> Self {
        self.settings.budget = Budget::Steps(steps);
        self
    }

    /// Accumulates gradients over `micro_batches` loader batches per optimizer step
    /// (default 1). Data-parallel steps synchronise once per optimizer step.
    pub fn accumulation_steps(mut self, micro_batches: usize) -> Self {
        self.settings.accumulation = micro_batches;
        self
    }

    /// The training data: a [`DataLoader`](kiln_data::DataLoader) of images, or any
    /// [`BatchSource`] of the objective's batches; its device must be the model's autodiff
    /// device.
    pub fn train_loader(mut self, loader: impl BatchSource<Batch = O::Batch> + 'static) -> Self {
        self.train = Some(Box::new(loader));
        self
    }

    /// Validation data (a loader or any [`BatchSource`] of the objective's batches),
    /// evaluated for the objective after every epoch on the model's inference device.
    pub fn valid_loader(mut self, loader: impl BatchSource<Batch = O::Batch> + 'static) -> Self {
        self.settings.valid = Some(Box::new(loader));
        self
    }

    /// Shows the live progress bar (default: on).
    pub fn progress(mut self, progress: bool) -> Self {
        self.settings.progress = progress;
        self
    }

    /// Prints a summary line per epoch and at the end (default: on).
    pub fn log_epochs(mut self, log: bool) -> Self {
        self.settings.log_epochs = log;
        self
    }

    /// Checks the configuration.
    pub fn build(self) -> Result<Trainer<M, S, O>, TrainError> {
        let train = self
            .train
            .ok_or_else(|| TrainError::Config("a training loader is required".into()))?;
        if train.device().is_some_and(|device| !device.is_autodiff()) {
            return Err(TrainError::Config("the training loader must build batches on an autodiff device (`Device::autodiff()`)".into()));
        }
        let settings = self.settings;
        match settings.budget {
            Budget::Epochs(0) => {
                return Err(TrainError::Config("epochs must be at least 1".into()));
            }
            Budget::Steps(0) => {
                return Err(TrainError::Config("max_steps must be at least 1".into()));
            }
            _ => {}
        }
        if settings.accumulation == 0 {
            return Err(TrainError::Config(
                "accumulation_steps must be at least 1 micro-batch".into(),
            ));
        }
        if train.num_batches() < settings.accumulation {
            return Err(TrainError::Config(format!(
                "the training loader yields {} batches per epoch, fewer than one step's {} micro-batches",
                train.num_batches(),
                settings.accumulation
            )));
        }
        if let Some(valid) = &settings.valid
            && valid.device().is_some_and(|device| device.is_autodiff())
        {
            return Err(TrainError::Config("the validation loader must build batches on an inference device (without autodiff)".into()));
        }
        let per_epoch = train.num_batches() / settings.accumulation;
        if self.start.step_in_epoch >= per_epoch {
            return Err(TrainError::Config(format!(
                "resuming at step {} of epoch {}, which has only {per_epoch} steps (another batch size or data set?)",
                self.start.step_in_epoch, self.start.epoch
            )));
        }
        Ok(Trainer {
            model: self.model,
            optimizer: self.optimizer,
            step: self.step,
            train,
            settings,
            checkpoint: self.checkpoint,
            observers: self.observers,
            stop: self.stop,
            start: self.start,
        })
    }
}

/// Trains one model replica; see [`Trainer::builder`] and [`Trainer::with_objective`].
pub struct Trainer<M, S = LocalStep, O: Objective = Classification> {
    model: M,
    optimizer: ModuleOptimizer,
    step: S,
    train: Source<O::Batch>,
    settings: Settings<O>,
    checkpoint: Option<Box<dyn CheckpointHook<M>>>,
    observers: Vec<Box<dyn TrainObserver>>,
    stop: Option<StopFlag>,
    start: TrainPosition,
}

impl<M: ImageClassifier> Trainer<M, LocalStep> {
    /// Starts configuring training of the image classifier `model` with `optimizer` (e.g.
    /// `SgdConfig::new().init()`), for [`Classification`] on [`ImageBatch`](kiln_data::ImageBatch)es.
    pub fn builder(model: M, optimizer: ModuleOptimizer) -> TrainerBuilder<M, LocalStep> {
        TrainerBuilder::new(model, optimizer, Classification)
    }
}

impl<M, O> Trainer<M, LocalStep<O>, O>
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
{
    /// Starts configuring training of any `model` for `objective` (its loss, the batches it
    /// reads) with `optimizer`; see [`Objective`] for an example.
    ///
    /// The objective fixes the batch type, so the training and validation data
    /// ([`train_loader`](TrainerBuilder::train_loader)) and any
    /// [`gradient_step`](TrainerBuilder::gradient_step) given later must be for it.
    pub fn with_objective(
        model: M,
        optimizer: ModuleOptimizer,
        objective: O,
    ) -> TrainerBuilder<M, LocalStep<O>, O> {
        TrainerBuilder::new(model, optimizer, objective)
    }
}

impl<M, S, O> Trainer<M, S, O>
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
    S: GradientStep<M, O::Batch>,
{
    /// Runs training and returns the trained model and what was recorded.
    pub fn fit(mut self) -> Result<(M, TrainReport), TrainError> {
        let per_epoch = self.train.num_batches() / self.settings.accumulation;
        let (epochs, total_steps) = match self.settings.budget {
            Budget::Epochs(epochs) => (epochs, epochs * per_epoch),
            Budget::Steps(steps) => (steps.div_ceil(per_epoch), steps),
        };
        let mut report = TrainReport::default();
        let mut model = self.model;
        let mut global_step = self.start.step;
        'epochs: for epoch in self.start.epoch..epochs {
            // A resumed epoch skips the steps done before the checkpoint.
            let skip = if epoch == self.start.epoch {
                self.start.step_in_epoch
            } else {
                0
            };
            let steps_this_epoch = (per_epoch - skip).min(total_steps.saturating_sub(global_step));
            if steps_this_epoch == 0 {
                // Resumed at the end of training: nothing is left to do.
                break;
            }
            let bar = epoch_bar(self.settings.progress, epoch, steps_this_epoch);
            let (mut loss_sum, mut correct, mut samples) = (0.0f64, 0usize, 0usize);
            let mut epoch_wait = std::time::Duration::ZERO;
            let first_step = global_step;
            let started = Instant::now();
            let mut batches = self
                .train
                .batches(epoch as u64, skip * self.settings.accumulation);
            for _ in 0..steps_this_epoch {
                let step_start = Instant::now();
                // Any source: the time the step waits for its batches is the data wait.
                let micro = batches
                    .by_ref()
                    .take(self.settings.accumulation)
                    .collect::<Result<Vec<_>, _>>()?;
                let data_wait = step_start.elapsed();
                epoch_wait += data_wait;
                if micro.len() < self.settings.accumulation {
                    break;
                }
                let lr = self.settings.schedule.lr(global_step);
                let out = self.step.gradients(&model, micro, global_step)?;
                if !out.loss.is_finite() {
                    return Err(TrainError::NonFiniteLoss {
                        step: global_step,
                        loss: out.loss,
                    });
                }
                model = self.optimizer.step(lr, model, out.grads);
                model = self.step.after_update(model, global_step)?;
                let accuracy = out.correct as f32 / out.samples.max(1) as f32;
                let images_per_sec =
                    out.samples as f64 / step_start.elapsed().as_secs_f64().max(1e-9);
                report.steps.push(StepRecord {
                    epoch,
                    step: global_step,
                    loss: out.loss,
                    accuracy,
                    lr,
                    images_per_sec,
                    data_wait,
                    loss_scale: self.step.loss_scale(),
                });
                report.first_step.get_or_insert_with(|| FirstStep {
                    finished: Instant::now(),
                    took: step_start.elapsed(),
                });
                for observer in &mut self.observers {
                    observer.on_step(report.steps.last().expect("just recorded"))?;
                }
                loss_sum += f64::from(out.loss);
                correct += out.correct;
                samples += out.samples;
                global_step += 1;
                let done_in_epoch = skip + (global_step - first_step);
                let position = if done_in_epoch == per_epoch {
                    TrainPosition {
                        step: global_step,
                        epoch: epoch + 1,
                        step_in_epoch: 0,
                    }
                } else {
                    TrainPosition {
                        step: global_step,
                        epoch,
                        step_in_epoch: done_in_epoch,
                    }
                };
                let stop = match &self.stop {
                    Some(flag) => self.step.agree_to_stop(flag.is_requested())?,
                    None => false,
                };
                if let Some(hook) = &mut self.checkpoint
                    && (stop || hook.should_save(&position, global_step == total_steps))
                {
                    // Every replica takes part: what they hold apart (batch-norm
                    // statistics) is made one, as before an evaluation.
                    model = self.step.before_eval(model)?;
                    hook.save(&position, &model, &self.optimizer, &self.step.saved_state())?;
                }
                if stop {
                    report.stopped_at = Some(position);
                    if position.step_in_epoch != 0 {
                        // Mid-epoch: the resumed run finishes the epoch (and validates it).
                        bar.finish_and_clear();
                        break 'epochs;
                    }
                    // The epoch's last step: validate and log the epoch, then stop.
                    break;
                }
                bar.inc(1);
                bar.set_message(format!(
                    "loss {:.4} acc {:5.1}% {:.0} img/s lr {lr:.4}",
                    out.loss,
                    100.0 * accuracy,
                    images_per_sec
                ));
            }
            drop(batches);
            let elapsed = started.elapsed();
            bar.finish_and_clear();
            let steps_done = (global_step - first_step).max(1);
            let mut summary = EpochSummary {
                epoch,
                train_loss: (loss_sum / steps_done as f64) as f32,
                train_accuracy: correct as f32 / samples.max(1) as f32,
                valid_loss: None,
                valid_accuracy: None,
                images_per_sec: samples as f64 / elapsed.as_secs_f64().max(1e-9),
                elapsed,
                data_wait: epoch_wait,
            };
            model = self.step.before_eval(model)?;
            if let Some(valid) = &mut self.settings.valid {
                let evaluation =
                    evaluate_with(&model.valid(), &self.settings.objective, valid.as_mut())?;
                summary.valid_loss = Some(evaluation.loss);
                summary.valid_accuracy = Some(evaluation.accuracy);
            }
            if self.settings.log_epochs {
                println!("{summary}");
            }
            for observer in &mut self.observers {
                observer.on_epoch(&summary)?;
            }
            report.epochs.push(summary);
            if report.stopped_at.is_some() {
                break;
            }
        }
        if let Some(hook) = &mut self.checkpoint {
            hook.finish()?;
        }
        if let (Some(position), true) = (report.stopped_at, self.settings.log_epochs) {
            println!(
                "stopped at step {} as asked{}",
                position.step,
                if self.checkpoint.is_some() {
                    ", after saving a checkpoint"
                } else {
                    ""
                }
            );
        }
        if self.settings.log_epochs {
            let images: usize = report
                .epochs
                .iter()
                .map(|e| (e.images_per_sec * e.elapsed.as_secs_f64()) as usize)
                .sum();
            let secs: f64 = report.epochs.iter().map(|e| e.elapsed.as_secs_f64()).sum();
            let val = report
                .final_valid_accuracy()
                .map(|a| format!(", final val acc {:.1}%", 100.0 * a))
                .unwrap_or_default();
            println!(
                "done: {global_step} steps, {images} images in {secs:.1}s ({:.0} img/s){val}",
                images as f64 / secs.max(1e-9)
            );
        }
        Ok((model, report))
    }
}
