//! A pipeline's options: its devices, objective, configuration, checkpoints, resume, stop
//! flag, observer and validation data (run by `train.rs`).

use std::path::PathBuf;
use std::sync::Mutex;

use burn::tensor::Device;
use kiln_checkpoint::{Checkpointer, RunIdentity};
use kiln_comm::Communicator;
use kiln_data::BatchSource;
use kiln_train::{Classification, Objective, StopFlag, TrainObserver};

use crate::runtime::PipelineConfig;

/// A pipeline over one device entry per stage.
///
/// ```
/// use burn::optim::SgdConfig;
/// use burn::tensor::Device;
/// use kiln_data::{DataLoader, SyntheticImages};
/// use kiln_pipeline::{Pipeline, PipelineConfig, schedule::ScheduleKind};
/// use kiln_resnet::{ResNetConfig, StemKind};
/// use kiln_train::LrSchedule;
///
/// let build = |device: &Device| {
///     kiln_core::init_module(device, 7, || {
///         ResNetConfig::resnet18(4).with_stem(StemKind::Cifar).with_base_width(2).init(device)
///     })
/// };
/// let mut loader = DataLoader::builder(SyntheticImages::new(32, 4, 1, [3, 8, 8]))
///     .batch_size(8)
///     .device(Device::flex().autodiff())
///     .build();
/// let config = PipelineConfig { schedule: ScheduleKind::OneFOneB, micro_batches: 4, ..PipelineConfig::default() };
/// let report = Pipeline::new(vec![Device::flex(); 2])
///     .config(config)
///     .train(build, || SgdConfig::new().init(), &LrSchedule::constant(0.05), &mut loader, 2)?;
/// assert_eq!(report.losses.len(), 2);
/// assert!(report.stages.iter().all(|s| s.peak_in_flight <= 2), "1F1B holds at most P");
/// # Ok::<(), kiln_pipeline::PipelineError>(())
/// ```
///
/// The last stage's loss is the [`Objective`]'s: [`Classification`] for
/// [`Pipeline::new`], any other (a user's [`Segmented`](kiln_core::Segmented) model with its own input, output,
/// batches and loss) with [`Pipeline::with_objective`]. The driver cuts the objective's
/// batches into micro-batches by samples ([`kiln_data::Batch::slice`]); the first virtual
/// stage feeds [`Objective::input`] to the model, the last scores its output.
pub struct Pipeline<O: Objective = Classification> {
    pub(crate) devices: Vec<Device>,
    pub(crate) objective: O,
    pub(crate) config: PipelineConfig,
    pub(crate) checkpointer: Option<Checkpointer>,
    pub(crate) resume: Option<(PathBuf, RunIdentity)>,
    pub(crate) stop: Option<StopFlag>,
    pub(crate) observers: Mutex<Vec<Box<dyn TrainObserver>>>,
    pub(crate) valid: Mutex<Option<ValidSource<O>>>,
    pub(crate) log_epochs: bool,
    pub(crate) progress: bool,
    /// With stages in other processes: the MPI world, one stage per process.
    pub(crate) processes: Option<Communicator>,
    /// Tests: every neighbouring pair of stages through a courier, even on one device (the
    /// CPU-only tests run the cross-device path so).
    #[cfg(test)]
    pub(crate) couriers_always: bool,
}

/// Where validation batches come from.
pub(crate) type ValidSource<O> = Box<dyn BatchSource<Batch = <O as Objective>::Batch> + Send>;

impl Pipeline<Classification> {
    /// One stage per entry of `devices` (CPU entries may repeat: stages are threads), for
    /// an image classifier ([`Classification`]).
    pub fn new(devices: Vec<Device>) -> Self {
        Self::with_objective(devices, Classification)
    }
}

impl<O: Objective> Pipeline<O> {
    /// One stage per entry of `devices`, training for `objective` (its loss on the last
    /// stage, the batches the driver cuts).
    pub fn with_objective(devices: Vec<Device>, objective: O) -> Self {
        Self {
            devices,
            objective,
            config: PipelineConfig::default(),
            checkpointer: None,
            resume: None,
            stop: None,
            observers: Mutex::new(Vec::new()),
            valid: Mutex::new(None),
            log_epochs: false,
            progress: true,
            processes: None,
            #[cfg(test)]
            couriers_always: false,
        }
    }

    /// Uses `config`.
    pub fn config(mut self, config: PipelineConfig) -> Self {
        self.config = config;
        self
    }

    /// Saves checkpoints as `checkpointer` says (every N steps and after the last): the
    /// stages' parts joined into one checkpoint of the data-parallel format (the whole
    /// model's weights in `model.bpk`, one optimizer part per stage), so it resumes under
    /// any plan: another split or schedule, data parallel, or
    /// [`kiln_checkpoint::resume`].
    pub fn checkpoint(mut self, checkpointer: Checkpointer) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Continues the run saved in the checkpoint at `path` (of any plan) if it belongs to
    /// `identity`: each stage takes its parameters and their optimizer state, the loader
    /// continues with the batches not yet seen, the learning rate from the saved step.
    pub fn resume(mut self, path: impl Into<PathBuf>, identity: RunIdentity) -> Self {
        self.resume = Some((path.into(), identity));
        self
    }

    /// Takes one attempt of a run ([`kiln_checkpoint::Attempt`], the same a data-parallel
    /// replica takes): its checkpointer, the checkpoint it resumes, its stop flag and, when
    /// `logs` (the one process that logs), the run's log. Returns the pipeline and where the
    /// attempt starts.
    ///
    /// # Errors
    /// When the checkpoint's manifest or the log cannot be read.
    pub fn attempt(
        mut self,
        attempt: &kiln_checkpoint::Attempt,
        logs: bool,
    ) -> Result<(Self, kiln_train::TrainPosition), crate::PipelineError> {
        if let Some(saver) = attempt.checkpointer() {
            self = self.checkpoint(saver);
        }
        let position = (attempt.resume_position()).map_err(crate::PipelineError::checkpoint)?;
        if let Some(path) = attempt.resumes_from() {
            self = self.resume(path, attempt.identity().clone());
        }
        if let Some(flag) = attempt.stop_flag() {
            self = self.stop_flag(flag.clone());
        }
        if logs && let Some(log) = attempt.run_log(&position)? {
            self = self.observer(log);
        }
        Ok((self, position))
    }

    /// Stops after the step during which `flag` is raised (with a checkpoint, when the run
    /// has them): [`PipelineReport::stopped_at`](crate::PipelineReport::stopped_at) says where.
    pub fn stop_flag(mut self, flag: StopFlag) -> Self {
        self.stop = Some(flag);
        self
    }

    /// Validates on `loader`'s batches (a loader, or any [`BatchSource`] of the objective's
    /// batches) after every epoch, forward through the first pipeline (each cut into
    /// micro-batches, the stages' batch-norm running statistics used): the epoch summaries'
    /// validation loss and accuracy. Build its batches on an inference device (without
    /// autodiff).
    pub fn valid_loader(self, loader: impl BatchSource<Batch = O::Batch> + Send + 'static) -> Self {
        *self.valid.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(loader));
        self
    }

    /// Runs the pipeline across the processes of `world` (an MPI world communicator,
    /// [`Communicator::mpi_world`]), one stage per process: with D data-parallel
    /// pipelines of P stages, D × P processes, process `r` running stage `r % P` of pipeline
    /// `r / P` on `devices[r]`, as thread `r` does in one process (every process passes the
    /// same list and the same loader, and drives its own stage). Activations and gradients
    /// travel as MPI messages whose length the receiver learns; each stage's copies add
    /// their gradients in rank order (the in-process sums); each step's loss is summed over
    /// the processes; rank 0's report holds the first pipeline's trained parameters. A
    /// failing stage ends the MPI job. Clipping and mixed precision (bf16, f16 with its loss
    /// scaler) work as in one process: each pipeline's stages agree on the whole gradient's
    /// norm and overflow. Checkpoints work too: each stage of the first pipeline writes its
    /// part into the shared run directory, rank 0 joins them into the checkpoint one process
    /// would write (resumable either way), every process agrees on each write's outcome and
    /// on a stop; a resume reads the same checkpoint in every process. Present in every build
    /// (a program offering MPI needs no `cfg`): without the `mpi` feature, training refuses it.
    pub fn across_processes(mut self, world: Communicator) -> Self {
        self.processes = Some(world);
        self
    }

    /// Prints every epoch's summary and the run's last line, as the trainer does (default:
    /// off).
    pub fn log_epochs(mut self, log: bool) -> Self {
        self.log_epochs = log;
        self
    }

    /// Tells `observer` every step (loss, accuracy, learning rate, images/s, data wait,
    /// loss scale) and every epoch's summary, e.g. a [`kiln_train::RunLog`]. Several may be
    /// added: each sees every record, in the order they were added.
    pub fn observer(self, observer: impl TrainObserver + 'static) -> Self {
        self.observers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(observer));
        self
    }

    /// Shows the live progress bar over each epoch's steps (default: on; hidden when stderr
    /// is not a terminal; across processes the first process shows it).
    pub fn progress(mut self, progress: bool) -> Self {
        self.progress = progress;
        self
    }
}
