//! A pipeline run: the stage threads and their links, the driver.

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use kiln_checkpoint::Manifest;
use kiln_comm::Communicator;
use kiln_core::{Segmented, panic_message};
use kiln_data::BatchSource;
use kiln_train::{Budget, LoopOptions, LrSchedule, Objective, TrainPosition, train_loop};

use crate::runtime::PipelineError;
use crate::runtime::checkpoint::{Writes, agree_start};
use crate::runtime::engine::{StagesEngine, ToStages};
use crate::runtime::groups::{StageGroups, stage_groups};
use crate::runtime::mailbox::{Abort, Mailbox};
use crate::runtime::pipeline::Pipeline;
use crate::runtime::report::{PipelineReport, finish};
use crate::runtime::stage_start::StageStart;
use crate::runtime::transfer;
use crate::runtime::worker::{Links, StepData};
use crate::schedule::Schedule;

impl<O: Objective> Pipeline<O> {
    /// Trains the model `build` makes (called once per stage, on its device: build it
    /// under `kiln_core::init_on_host` so every call gives the same model whatever the
    /// device's kind; `init_module` does when every stage is on one kind) up to step
    /// `steps` on `loader`'s batches (a [`DataLoader`](kiln_data::DataLoader), or any
    /// [`BatchSource`] of the objective's batches), each cut into micro-batches, with one
    /// `optimizer` (made by the factory) per stage. An epoch is the loader's batches ÷ the
    /// data-parallel pipelines (whole steps).
    ///
    /// # Errors
    /// A bad configuration, a schedule that cannot be built, a loader error, a batch with
    /// fewer samples than micro-batches, or a stage that fails (the root cause, reported
    /// once every stage stopped).
    pub fn train<M, B, F, S>(
        &self,
        build: B,
        optimizer: F,
        schedule: &LrSchedule,
        loader: &mut S,
        steps: usize,
    ) -> Result<PipelineReport, PipelineError>
    where
        M: Segmented<Input = O::Input, Output = O::Output> + 'static,
        B: Fn(&Device) -> M + Sync,
        F: Fn() -> ModuleOptimizer + Sync,
        S: BatchSource<Batch = O::Batch> + ?Sized,
    {
        self.config.validate()?;
        let start = self.resume_position();
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
        let plan = Schedule::new(
            self.config.schedule,
            stages,
            self.config.micro_batches_per_step(),
        )?;
        // The stage threads of this process: all of them, or its own stage across processes.
        let local: Vec<usize> = match &self.processes {
            None => (0..total).collect(),
            Some(world) => {
                self.refuse_across_processes(world, stages, groups)?;
                vec![world.rank()]
            }
        };
        // Across processes every one starts at the same step (or every one fails): after
        // the world's size is checked, before any communication.
        let start = match &self.processes {
            Some(world) => agree_start(world, self.checkpointer.as_ref(), start)?,
            None => start?,
        };
        let threads = self
            .config
            .threads_per_stage
            .unwrap_or_else(|| (rayon::current_num_threads() / local.len()).max(1));
        let warm = kiln_core::warm_pool::pools_may_poll(threads, local.len());

        // Messages stay inside a pipeline: one set of channels per data-parallel group.
        let mut peers = Vec::with_capacity(groups);
        let mut inboxes = Vec::with_capacity(total);
        for _ in 0..groups {
            let (senders, receivers): (Vec<_>, Vec<_>) = (0..stages).map(|_| unbounded()).unzip();
            peers.push(senders);
            inboxes.extend(receivers);
        }
        // The copies of stage i (one per group) reduce their gradients in their own group.
        let timeout = self.config.timeout;
        // Clipping and mixed precision check the whole model's gradient: the stages of each
        // pipeline agree (after the reduction every pipeline holds the same gradients, so
        // each pipeline's agreement is the whole run's). Stages that share a tied parameter
        // sum its gradients over the same group; only the stages, which build the model,
        // know whether they do, so every pipeline of several stages has its group.
        let agreeing = stages > 1;
        let StageGroups {
            replicas,
            pipelines,
            across,
        } = stage_groups(self.processes.as_ref(), (groups, stages), timeout, agreeing)?;
        // Across processes the pipeline's group is shared by the stage's agreement and (for
        // links and the parameters' gathering) the run: MPI runs a rank's operations in
        // submission order, and a stage's agreement (inside its step) precedes the driver's
        // loss sum over the world (after the report), which precedes the next step's data.
        let across_agreement = across.as_ref().filter(|_| agreeing);
        type Channel<B> = (Sender<StepData<B>>, Receiver<StepData<B>>);
        let (step_senders, step_receivers): (Vec<_>, Vec<_>) = local
            .iter()
            .map(|_| -> Channel<O::Batch> { bounded(1) })
            .unzip();
        let mut step_receivers = step_receivers.into_iter();
        let (done_sender, done_receiver) = unbounded();
        let (part_sender, part_receiver) = unbounded();
        let abort = Abort::default();
        let mut writes = Writes::new(part_receiver, stages, timeout);
        if let Some(world) = &self.processes {
            writes = writes.across(world, abort.flag());
        }
        // Stages on several devices (in this process): the micro-batches move to the first
        // and last stages' devices, and values between stages to the receiver's.
        let train_devices: Vec<Device> = self
            .devices
            .iter()
            .map(|device| self.config.train_device(device))
            .collect();
        let always = self.couriers_always();
        let mixed = self.processes.is_none() && (always || transfer::mixed(&train_devices));
        std::thread::scope(|scope| {
            // Sends between stages on different devices go through couriers that move them.
            let (mut routes, couriers) = if mixed {
                transfer::routes(scope, &peers, &train_devices, &abort, always)
            } else {
                (Vec::new(), Vec::new())
            };
            // Across processes, the local stage's sends to the others go through link threads.
            #[cfg(feature = "mpi")]
            let mut linked = None;
            #[cfg(feature = "mpi")]
            if let (Some(world), Some(pipeline)) = (&self.processes, &across) {
                let rank = world.rank();
                let (group, stage) = (rank / stages, rank % stages);
                let device = self.config.train_device(&self.devices[rank]);
                let (links, guard) = crate::runtime::processes::link(
                    scope,
                    pipeline,
                    peers[group][stage].clone(),
                    device,
                    abort.clone(),
                )?;
                peers[group] = links;
                linked = Some(guard);
            }
            let handles: Vec<_> = inboxes
                .into_iter()
                .zip(replicas)
                .zip(
                    pipelines
                        .iter()
                        .map(|own| own.as_ref().or(across_agreement)),
                )
                .enumerate()
                .filter(|(thread, _)| local.contains(thread))
                .map(|(thread, ((inbox, replicas), pipeline))| {
                    let steps = step_receivers.next().expect("one per local thread");
                    let (group, index) = (thread / stages, thread % stages);
                    let start = StageStart {
                        index,
                        device: train_devices[thread].clone(),
                        threads,
                        warm,
                        build: &build,
                        optimizer: &optimizer,
                        objective: &self.objective,
                        config: &self.config,
                        plan: &plan,
                        links: Links {
                            mailbox: Mailbox::new(index, inbox, self.config.timeout, abort.clone()),
                            peers: routes
                                .get_mut(thread)
                                .map(std::mem::take)
                                .unwrap_or_else(|| peers[group].clone()),
                            replicas,
                            pipeline,
                            thread,
                            // The pipelines mirror each other: the first one's stages save.
                            parts: (self.checkpointer.is_some() && group == 0)
                                .then(|| part_sender.clone()),
                            batches_to: (mixed && (index == 0 || index + 1 == stages))
                                .then(|| train_devices[thread].clone()),
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
                threads: &local,
                total,
                across: self.processes.as_ref(),
                done: &done_receiver,
                abort: &abort,
                stages,
            };
            let mut observers = self.observers.lock().unwrap_or_else(|p| p.into_inner());
            let mut valid = self.valid.lock().unwrap_or_else(|p| p.into_inner());
            let options = LoopOptions {
                schedule,
                budget: Budget::Steps(steps),
                start,
                stop: self.stop.as_ref(),
                observers: observers.as_mut_slice(),
                valid: valid
                    .as_deref_mut()
                    .map(|v| v as &mut dyn BatchSource<Batch = O::Batch>),
                // Across processes, one bar: the first process's.
                progress: self.progress && self.processes.as_ref().is_none_or(|w| w.rank() == 0),
                log_epochs: self.log_epochs,
                reporting: self.objective.reporting(),
            };
            let checkpoints = self.checkpointer.as_ref().map(|c| (c, &mut writes));
            let mut engine = StagesEngine::new(&self.config, to_stages, checkpoints);
            let driven =
                train_loop(&mut engine, loader, options).map(|report| (engine.driven(), report));
            if driven.is_err() {
                abort.raise();
            }
            drop(step_senders);
            let mut results = Vec::with_capacity(local.len());
            for (&thread, handle) in local.iter().zip(handles) {
                results.push(handle.join().unwrap_or_else(|panic| {
                    Err(PipelineError::Stage {
                        stage: thread % stages,
                        message: panic_message(&*panic),
                    })
                }));
            }
            #[cfg_attr(not(feature = "mpi"), allow(unused_mut))]
            let mut helpers = transfer::join(couriers);
            #[cfg(feature = "mpi")]
            helpers.extend(linked.and_then(|guard| guard.finish().err()));
            let report = finish(driven, results, helpers, &local, &plan);
            self.across_processes_end(report, across.as_ref())
        })
    }
}

impl<O: Objective> Pipeline<O> {
    /// Whether every neighbouring pair of stages sends through a courier (tests only).
    fn couriers_always(&self) -> bool {
        #[cfg(test)]
        return self.couriers_always;
        #[cfg(not(test))]
        false
    }

    /// Refuses what does not run across processes yet.
    fn refuse_across_processes(
        &self,
        world: &Communicator,
        stages: usize,
        groups: usize,
    ) -> Result<(), PipelineError> {
        #[cfg(feature = "mpi")]
        crate::runtime::processes::check(world, stages, groups)?;
        #[cfg(not(feature = "mpi"))]
        let _ = (world, stages, groups);
        // Clipping, mixed precision and checkpoints work: the stages agree over the world.
        Ok(())
    }

    /// Across processes: rank 0 gathers every stage's trained parameters; a failure ends
    /// the MPI job, so that no other process waits for this one.
    fn across_processes_end(
        &self,
        report: Result<PipelineReport, PipelineError>,
        pipeline: Option<&Communicator>,
    ) -> Result<PipelineReport, PipelineError> {
        let Some(world) = &self.processes else {
            return report;
        };
        let report = match report {
            Ok(report) => report,
            Err(err) => {
                // MPI's abort ends every process (it does not return).
                world.abort(format!("its pipeline stage failed: {err}"));
                return Err(err);
            }
        };
        // Each pipeline's first stage gathers its pipeline's parameters (the pipelines mirror
        // each other): world rank 0 holds the first pipeline's.
        #[cfg(feature = "mpi")]
        let report = {
            let mut report = report;
            if let Some(pipeline) = pipeline {
                crate::runtime::processes::gather_params(
                    pipeline,
                    &mut report.params,
                    self.config.timeout,
                )?;
            }
            report
        };
        #[cfg(not(feature = "mpi"))]
        let _ = pipeline;
        Ok(report)
    }

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
