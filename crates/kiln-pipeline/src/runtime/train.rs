//! The driver: builds the stages, cuts batches into micro-batches, runs the steps.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use burn::optim::ModuleOptimizer;
use burn::tensor::{Device, Tensor};
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use kiln_amp::AmpStats;
use kiln_checkpoint::{Checkpointer, Manifest, RunIdentity, resume_owning};
use kiln_comm::{Communicator, InProcessGroup};
use kiln_core::{ImageClassifier, Segmented, panic_message, read_params};
use kiln_data::DataLoader;
use kiln_train::{EpochSummary, LrSchedule, MeanGradient, StopFlag, TrainObserver, TrainPosition};

use crate::runtime::checkpoint::Writes;
use crate::runtime::driver::{Around, Driven, ToStages, drive};
use crate::runtime::mailbox::{Abort, Mailbox};
use crate::runtime::stage::{Stage, owned_infos};
use crate::runtime::worker::{Links, StepData, StepDone, Update, run_stage};
use crate::runtime::{PipelineConfig, PipelineError};
use crate::schedule::{Costs, Schedule, simulate};

/// What one stage held and did.
#[derive(Debug, Clone, PartialEq)]
pub struct StageReport {
    /// Segment indices (in [`Segmented::segments`] order) of each of its chunks.
    pub segments: Vec<Range<usize>>,
    /// Bytes of the parameters and buffers the stage holds.
    pub param_bytes: usize,
    /// The most micro-batch activations (counting each chunk) it held at once.
    pub peak_in_flight: usize,
    /// Fraction of the step time it computed, averaged over steps after the first.
    pub busy_fraction: f64,
    /// Mean forward time of one micro-batch, per chunk (steps after the first).
    pub forward_time: Vec<Duration>,
    /// Mean backward time of one micro-batch, per chunk (steps after the first).
    pub backward_time: Vec<Duration>,
}

/// What a pipeline run did, and the trained parameters.
#[derive(Debug, Clone)]
pub struct PipelineReport {
    /// Mean loss of every step.
    pub losses: Vec<f32>,
    /// Per stage.
    pub stages: Vec<StageReport>,
    /// Mean step time after the first step.
    pub step_time: Duration,
    /// The step time the schedule predicts from the measured per-chunk forward and backward
    /// times (its simulation, bubble included, transfers and the optimizer step not): what
    /// `step_time` would be if the stages did nothing but compute and wait for each other.
    pub predicted_step_time: Duration,
    /// The trained trainable parameters, by path.
    pub params: HashMap<String, Vec<f32>>,
    /// Where a stop request ([`Pipeline::stop_flag`]) ended the run, if one did (after a
    /// checkpoint, when the run has them).
    pub stopped_at: Option<TrainPosition>,
    /// Every whole epoch's summary: training loss and accuracy, and validation through the
    /// pipeline with [`Pipeline::valid_loader`].
    pub epochs: Vec<EpochSummary>,
    /// What mixed precision did ([`PipelineConfig::precision`]): steps, skipped steps and
    /// the loss scale, the same on every stage (they agree on every skip).
    pub amp: AmpStats,
}

impl PipelineReport {
    /// The measured bubble: the fraction of the step the stages were idle, averaged.
    pub fn bubble_fraction(&self) -> f64 {
        let stages = self.stages.len().max(1) as f64;
        1.0 - self.stages.iter().map(|s| s.busy_fraction).sum::<f64>() / stages
    }
}

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
pub struct Pipeline {
    devices: Vec<Device>,
    config: PipelineConfig,
    checkpointer: Option<Checkpointer>,
    resume: Option<(PathBuf, RunIdentity)>,
    stop: Option<StopFlag>,
    observer: Mutex<Option<Box<dyn TrainObserver>>>,
    valid: Mutex<Option<DataLoader>>,
    log_epochs: bool,
}

impl Pipeline {
    /// One stage per entry of `devices` (CPU entries may repeat: stages are threads).
    pub fn new(devices: Vec<Device>) -> Self {
        Self {
            devices,
            config: PipelineConfig::default(),
            checkpointer: None,
            resume: None,
            stop: None,
            observer: Mutex::new(None),
            valid: Mutex::new(None),
            log_epochs: false,
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

    /// Stops after the step during which `flag` is raised (with a checkpoint, when the run
    /// has them): [`PipelineReport::stopped_at`] says where.
    pub fn stop_flag(mut self, flag: StopFlag) -> Self {
        self.stop = Some(flag);
        self
    }

    /// Validates on `loader`'s batches after every epoch, forward through the first pipeline
    /// (each cut into micro-batches, the stages' batch-norm running statistics used): the
    /// epoch summaries' validation loss and accuracy. Build its batches on an inference
    /// device (without autodiff).
    pub fn valid_loader(self, loader: DataLoader) -> Self {
        *self.valid.lock().unwrap_or_else(|p| p.into_inner()) = Some(loader);
        self
    }

    /// Prints every epoch's summary as the trainer does (default: off).
    pub fn log_epochs(mut self, log: bool) -> Self {
        self.log_epochs = log;
        self
    }

    /// Tells `observer` every step (loss, accuracy, learning rate, images/s, data wait) and
    /// every epoch's training summary, e.g. a [`kiln_train::RunLog`].
    pub fn observer(self, observer: impl TrainObserver + 'static) -> Self {
        *self.observer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(observer));
        self
    }

    /// Trains the model `build` makes (called once per stage, on its device: build it
    /// under `kiln_core::init_module` so every call gives the same model) up to step
    /// `steps` on `loader`'s batches, each cut into micro-batches, with one `optimizer`
    /// (made by the factory) per stage. An epoch is the loader's batches ÷ the
    /// data-parallel pipelines (whole steps).
    ///
    /// # Errors
    /// A bad configuration, a schedule that cannot be built, a loader error, or a stage
    /// that fails (the root cause, reported once every stage stopped).
    pub fn train<M, B, O>(
        &self,
        build: B,
        optimizer: O,
        schedule: &LrSchedule,
        loader: &mut DataLoader,
        steps: usize,
    ) -> Result<PipelineReport, PipelineError>
    where
        M: ImageClassifier + Segmented<Input = Tensor<4>, Output = Tensor<2>> + 'static,
        B: Fn(&Device) -> M + Sync,
        O: Fn() -> ModuleOptimizer + Sync,
    {
        self.config.validate()?;
        let start = self.resume_position()?;
        let groups = self.config.data_parallel;
        let total = self.devices.len();
        if total == 0 {
            return Err(PipelineError::Config(
                "a pipeline needs at least one device".into(),
            ));
        }
        if !total.is_multiple_of(groups) {
            return Err(PipelineError::Config(format!(
                "{total} devices cannot form {groups} data-parallel pipelines of equal length"
            )));
        }
        let stages = total / groups;
        let slowdown = &self.config.emulated_slowdown;
        if !slowdown.is_empty() && slowdown.len() != stages {
            return Err(PipelineError::Config(format!(
                "emulated_slowdown names {} stages, the pipeline has {stages}",
                slowdown.len()
            )));
        }
        let plan = Schedule::new(self.config.schedule, stages, self.config.micro_batches)?;
        let threads = self
            .config
            .threads_per_stage
            .unwrap_or_else(|| (rayon::current_num_threads() / total).max(1));

        // Messages stay inside a pipeline: one set of channels per data-parallel group.
        let mut peers = Vec::with_capacity(groups);
        let mut inboxes = Vec::with_capacity(total);
        for _ in 0..groups {
            let (senders, receivers): (Vec<_>, Vec<_>) = (0..stages).map(|_| unbounded()).unzip();
            peers.push(senders);
            inboxes.extend(receivers);
        }
        // The copies of stage i (one per group) reduce their gradients in their own group;
        // with clipping, the stages of each pipeline agree on the whole gradient's norm.
        let timeout = self.config.timeout;
        let replicas = communicators(groups, stages, timeout, Members::CopiesOfAStage, groups > 1);
        // Clipping and mixed precision check the whole model's gradient: its stages agree.
        let agreeing =
            (self.config.max_grad_norm.is_some() || !self.config.precision.is_f32()) && stages > 1;
        let pipelines = communicators(
            groups,
            stages,
            timeout,
            Members::StagesOfAPipeline,
            agreeing,
        );
        let (step_senders, step_receivers): (Vec<Sender<StepData>>, Vec<Receiver<StepData>>) =
            (0..total).map(|_| bounded(1)).unzip();
        let (done_sender, done_receiver) = unbounded();
        let (part_sender, part_receiver) = unbounded();
        let mut writes = Writes::new(part_receiver, stages, timeout);
        let abort = Abort::default();
        std::thread::scope(|scope| {
            let handles: Vec<_> = inboxes
                .into_iter()
                .zip(step_receivers)
                .zip(replicas)
                .zip(pipelines)
                .enumerate()
                .map(|(thread, (((inbox, steps), replicas), pipeline))| {
                    let (group, index) = (thread / stages, thread % stages);
                    let start = StageStart {
                        index,
                        device: self.devices[thread].clone().autodiff(),
                        threads,
                        build: &build,
                        optimizer: &optimizer,
                        config: &self.config,
                        plan: &plan,
                        links: Links {
                            mailbox: Mailbox::new(index, inbox, self.config.timeout, abort.clone()),
                            peers: peers[group].clone(),
                            replicas,
                            pipeline,
                            thread,
                            // The pipelines mirror each other: the first one's stages save.
                            parts: (self.checkpointer.is_some() && group == 0)
                                .then(|| part_sender.clone()),
                        },
                        resume: self.resume.as_ref(),
                        steps,
                        done: done_sender.clone(),
                        abort: abort.clone(),
                    };
                    std::thread::Builder::new()
                        .name(format!("kiln-stage-{group}-{index}"))
                        .spawn_scoped(scope, move || start.run())
                        .expect("spawning a stage thread")
                })
                .collect();
            drop((peers, done_sender, part_sender));
            let to_stages = ToStages {
                step_senders: &step_senders,
                done: &done_receiver,
                abort: &abort,
                stages,
            };
            let mut observer = self.observer.lock().unwrap_or_else(|p| p.into_inner());
            let mut valid = self.valid.lock().unwrap_or_else(|p| p.into_inner());
            let around = Around {
                start,
                steps,
                checkpoints: self.checkpointer.as_ref().map(|c| (c, &mut writes)),
                stop: self.stop.as_ref(),
                observer: observer.as_deref_mut().map(|o| o as &mut dyn TrainObserver),
                valid: valid.as_mut(),
                log_epochs: self.log_epochs,
            };
            let driven = drive(&self.config, schedule, loader, around, &to_stages);
            if driven.is_err() {
                abort.raise();
            }
            drop(step_senders);
            let mut results = Vec::with_capacity(total);
            for (thread, handle) in handles.into_iter().enumerate() {
                results.push(handle.join().unwrap_or_else(|panic| {
                    Err(PipelineError::Stage {
                        stage: thread % stages,
                        message: panic_message(&*panic),
                    })
                }));
            }
            finish(driven, results, &plan)
        })
    }
}

impl Pipeline {
    /// Where a resumed run starts: the checkpoint's position, once its manifest is read and
    /// its run is this one (each stage checks every file when it loads its part).
    fn resume_position(&self) -> Result<TrainPosition, PipelineError> {
        let Some((path, identity)) = &self.resume else {
            return Ok(TrainPosition::default());
        };
        let manifest =
            Manifest::read(path).map_err(|err| PipelineError::Checkpoint(err.to_string()))?;
        let differences = identity.differences(&manifest.run);
        if !differences.is_empty() {
            return Err(PipelineError::Checkpoint(format!(
                "the checkpoint {} does not match this run: {}",
                path.display(),
                differences.join("; ")
            )));
        }
        Ok(manifest.position.into())
    }
}

/// Who shares an in-process group in [`communicators`].
#[derive(Clone, Copy, PartialEq)]
enum Members {
    /// The D copies of one stage.
    CopiesOfAStage,
    /// The P stages of one pipeline.
    StagesOfAPipeline,
}

/// One communicator per stage thread, in (group, stage) order, for in-process groups of
/// `members`; `None` for every thread unless `wanted`.
fn communicators(
    groups: usize,
    stages: usize,
    timeout: Duration,
    members: Members,
    wanted: bool,
) -> Vec<Option<Communicator>> {
    let mut slots: Vec<Option<Communicator>> = (0..groups * stages).map(|_| None).collect();
    if !wanted {
        return slots;
    }
    let by_stage = members == Members::CopiesOfAStage;
    let (sets, size) = if by_stage {
        (stages, groups)
    } else {
        (groups, stages)
    };
    for set in 0..sets {
        let comms = InProcessGroup::new(size).timeout(timeout).build();
        for (rank, comm) in comms.into_iter().enumerate() {
            let (group, stage) = if by_stage { (rank, set) } else { (set, rank) };
            slots[group * stages + stage] = Some(comm);
        }
    }
    slots
}

/// What a stage thread needs to build and run its stage.
struct StageStart<'a, B, O, H> {
    index: usize,
    device: Device,
    threads: usize,
    build: &'a B,
    optimizer: &'a O,
    config: &'a PipelineConfig,
    plan: &'a Schedule,
    links: Links<H>,
    resume: Option<&'a (PathBuf, RunIdentity)>,
    steps: Receiver<StepData>,
    done: Sender<StepDone>,
    abort: Abort,
}

impl<B, O, M> StageStart<'_, B, O, M::Hidden>
where
    M: ImageClassifier + Segmented<Input = Tensor<4>, Output = Tensor<2>> + 'static,
    B: Fn(&Device) -> M + Sync,
    O: Fn() -> ModuleOptimizer + Sync,
{
    /// The stage thread's life: its own pool, its share of the model, its steps. A failure
    /// (an error or a panic) raises the abort flag, so that its peers stop waiting at once.
    fn run(self) -> Result<Stage<M>, PipelineError> {
        let index = self.index;
        let abort = self.abort.clone();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.build_and_train()))
                .unwrap_or_else(|panic| {
                    Err(PipelineError::Stage {
                        stage: index,
                        message: panic_message(&*panic),
                    })
                });
        if result.is_err() {
            abort.raise();
        }
        result
    }

    fn build_and_train(self) -> Result<Stage<M>, PipelineError> {
        let index = self.index;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads)
            .thread_name(move |i| format!("kiln-stage-{index}-compute-{i}"))
            .build()
            .map_err(|err| PipelineError::Stage {
                stage: index,
                message: err.to_string(),
            })?;
        pool.install(|| {
            // Every stage derives the same split from its own build: no full model is
            // built anywhere else.
            let model = (self.build)(&self.device);
            let stages = self.plan.stages();
            let split = self
                .config
                .segments_per_virtual_stage(model.segments().len(), stages)?;
            let chunks = chunk_ranges(&split, self.plan).swap_remove(index);
            let mut optimizer = (self.optimizer)();
            let mut step_state = kiln_train::StepState::Null;
            // Resumed: the checkpoint's parameters, and the optimizer state of the stage's own.
            let model = match self.resume {
                None => model,
                Some((path, identity)) => {
                    let owned: Vec<String> = owned_infos(&model, &chunks)
                        .into_iter()
                        .filter(|info| info.trainable)
                        .map(|info| info.path)
                        .collect();
                    let resumed = resume_owning(path, identity, model, optimizer, &owned)
                        .map_err(|err| PipelineError::Checkpoint(err.to_string()))?;
                    optimizer = resumed.optimizer;
                    step_state = resumed.step_state;
                    resumed.model
                }
            };
            let mut stage = Stage::new(model, chunks);
            stage.emulated_slowdown = self
                .config
                .emulated_slowdown
                .get(index)
                .copied()
                .unwrap_or(1.0);
            let mut rule = MeanGradient::new(self.config.precision.clone());
            if let Some(norm) = self.config.max_grad_norm {
                rule = rule
                    .with_max_norm(norm)
                    .map_err(|err| PipelineError::Config(err.to_string()))?;
            }
            // The loss scaler continues where the checkpoint left it.
            rule.restore_state(&step_state)
                .map_err(|err| PipelineError::Checkpoint(err.to_string()))?;
            let update = Update { optimizer, rule };
            run_stage(
                index, stage, self.plan, update, self.links, self.steps, self.done,
            )
        })
    }
}

/// Segment ranges of each stage's chunks, from the segments per virtual stage.
fn chunk_ranges(split: &[usize], plan: &Schedule) -> Vec<Vec<Range<usize>>> {
    let mut starts = Vec::with_capacity(split.len());
    let mut next = 0;
    for count in split {
        starts.push(next..next + count);
        next += count;
    }
    (0..plan.stages())
        .map(|stage| {
            (0..plan.chunks())
                .map(|chunk| starts[plan.virtual_stage(stage, chunk)].clone())
                .collect()
        })
        .collect()
}

/// The report, or the root cause of a failure (a stage's own error before the errors of
/// stages that only lost it).
fn finish<M: ImageClassifier>(
    driven: Result<Driven, PipelineError>,
    results: Vec<Result<Stage<M>, PipelineError>>,
    plan: &Schedule,
) -> Result<PipelineReport, PipelineError> {
    let mut errors = Vec::new();
    let mut trained = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Ok(stage) => trained.push(stage),
            Err(err) => errors.push(err),
        }
    }
    let driven = match driven {
        Ok(driven) if errors.is_empty() => driven,
        Ok(_) => Driven::default(),
        Err(err) => {
            errors.push(err);
            Driven::default()
        }
    };
    if !errors.is_empty() {
        let root = errors.iter().position(|e| !e.is_consequence()).unwrap_or(0);
        return Err(errors.swap_remove(root));
    }
    let steps_timed = driven.losses.len().saturating_sub(1).max(1) as u32;
    let step_time = driven.step_time / steps_timed;
    // The data-parallel groups' stages mirror each other: report the first group's.
    trained.truncate(plan.stages());
    let amp = trained.first().map(|stage| stage.amp).unwrap_or_default();
    let mut params = HashMap::new();
    let mut stages = Vec::with_capacity(trained.len());
    for (index, stage) in trained.into_iter().enumerate() {
        let flat = read_params(&stage.model, stage.layout());
        for entry in stage.layout().entries() {
            let values = flat[entry.offset..entry.offset + entry.info.numel()].to_vec();
            params.insert(entry.info.path.clone(), values);
        }
        // Busy time: every forward and backward the stage ran.
        let busy: Duration = driven.forward[index]
            .iter()
            .chain(&driven.backward[index])
            .sum::<Duration>()
            / steps_timed;
        let per_micro_batch = |times: &[Duration]| -> Vec<Duration> {
            let count = steps_timed * plan.micro_batches() as u32;
            times.iter().map(|t| *t / count.max(1)).collect()
        };
        stages.push(StageReport {
            segments: stage.chunks().to_vec(),
            param_bytes: stage.param_bytes,
            peak_in_flight: driven.peak[index],
            busy_fraction: busy.as_secs_f64() / step_time.as_secs_f64().max(1e-12),
            forward_time: per_micro_batch(&driven.forward[index]),
            backward_time: per_micro_batch(&driven.backward[index]),
        });
    }
    let predicted_step_time = predicted_step_time(&stages, plan);
    Ok(PipelineReport {
        losses: driven.losses,
        stages,
        step_time,
        predicted_step_time,
        params,
        stopped_at: driven.stopped_at,
        epochs: driven.epochs,
        amp,
    })
}

/// The schedule's simulated step time with each virtual stage's measured compute times.
fn predicted_step_time(stages: &[StageReport], plan: &Schedule) -> Duration {
    let virtual_stages = plan.virtual_stages();
    let (mut forward, mut backward) = (vec![0.0; virtual_stages], vec![0.0; virtual_stages]);
    for (index, stage) in stages.iter().enumerate() {
        for (chunk, (f, b)) in stage
            .forward_time
            .iter()
            .zip(&stage.backward_time)
            .enumerate()
        {
            let v = plan.virtual_stage(index, chunk);
            forward[v] = f.as_secs_f64();
            backward[v] = b.as_secs_f64();
        }
    }
    let costs = Costs::per_virtual_stage(forward, backward);
    simulate(plan, &costs)
        .map(|timeline| Duration::from_secs_f64(timeline.step_time()))
        .unwrap_or_default()
}
