//! The training loop.

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use kiln_core::{Forward, ImageClassifier};
use kiln_data::BatchSource;

use crate::metrics::TrainReport;
use crate::replica_engine::ReplicaEngine;
use crate::{
    Budget, CheckpointHook, Classification, GradientStep, LocalStep, LoopOptions, LrSchedule,
    Objective, StopFlag, TrainError, TrainObserver, TrainPosition, train_loop,
};

/// Where a trainer reads batches of `B` from: any [`BatchSource`], boxed so that the
/// builder's type does not name it.
type Source<B> = Box<dyn BatchSource<Batch = B>>;

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
        if let Some(valid) = &settings.valid
            && valid.device().is_some_and(|device| device.is_autodiff())
        {
            return Err(TrainError::Config("the validation loader must build batches on an inference device (without autodiff)".into()));
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
    /// Runs training and returns the trained model and what was recorded: kiln's one
    /// training loop ([`train_loop`](crate::train_loop)) over this replica's steps.
    ///
    /// # Errors
    /// Too few batches for one step, a resume position outside the data's epoch, a loader's
    /// error, a non-finite loss, a failing gradient step, observer or checkpoint.
    pub fn fit(self) -> Result<(M, TrainReport), TrainError> {
        let Trainer {
            model,
            optimizer,
            mut step,
            mut train,
            settings,
            checkpoint,
            mut observers,
            stop,
            start,
        } = self;
        let Settings {
            schedule,
            budget,
            accumulation,
            mut valid,
            objective,
            progress,
            log_epochs,
        } = settings;
        let reporting = objective.reporting();
        step.agree_on_start(start.step)?;
        let mut engine = ReplicaEngine::new(
            (model, optimizer, step),
            objective,
            accumulation,
            checkpoint,
        );
        let options = LoopOptions {
            schedule: &schedule,
            budget,
            start,
            stop: stop.as_ref(),
            observers: &mut observers,
            valid: valid
                .as_deref_mut()
                .map(|v| v as &mut dyn BatchSource<Batch = O::Batch>),
            progress,
            log_epochs,
            reporting,
        };
        let report = train_loop(&mut engine, train.as_mut(), options)?;
        Ok((engine.into_model(), report))
    }
}
