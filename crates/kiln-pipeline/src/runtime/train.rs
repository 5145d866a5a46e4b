//! A pipeline run: this process's stage threads started, the training loop driving them,
//! their results gathered into the report.

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use kiln_comm::Communicator;
use kiln_core::Segmented;
use kiln_data::BatchSource;
use kiln_train::{
    Budget, LoopOptions, LrSchedule, Objective, TrainObserver, TrainPosition, TrainReport,
    train_loop,
};

use crate::runtime::PipelineError;
use crate::runtime::checkpoint::Writes;
use crate::runtime::engine::{Driven, StagesEngine, ToStages};
use crate::runtime::groups::{StageGroups, stage_groups};
use crate::runtime::launch::{Channels, Launch};
use crate::runtime::layout::RunLayout;
use crate::runtime::mailbox::Abort;
use crate::runtime::pipeline::Pipeline;
use crate::runtime::report::{PipelineReport, finish};

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
        let layout = self.run_layout()?;
        let (
            StageGroups {
                replicas,
                pipelines,
                across,
            },
            agreeing,
        ) = self.groups_of(&layout)?;
        // Across processes the pipeline's group is shared by the stage's agreement and (for
        // links and the parameters' gathering) the run: MPI runs a rank's operations in
        // submission order, and a stage's agreement (inside its step) precedes the driver's
        // loss sum over the world (after the report), which precedes the next step's data.
        let across_agreement = across.as_ref().filter(|_| agreeing);
        let pipelines = pipelines
            .iter()
            .map(|own| own.as_ref().or(across_agreement))
            .collect();
        let Channels {
            stage_ends,
            step_senders,
            done,
            parts,
        } = Channels::new(&layout, replicas, pipelines);
        let abort = Abort::default();
        let mut writes = Writes::new(parts, layout.stages, self.config.timeout);
        if let Some(world) = &self.processes {
            writes = writes.across(world, abort.flag());
        }
        let launch = Launch {
            pipeline: self,
            build: &build,
            optimizer: &optimizer,
            layout: &layout,
            abort: &abort,
            #[cfg(feature = "mpi")]
            across: across.as_ref(),
        };
        std::thread::scope(|scope| {
            let stage_threads = launch.start::<M>(scope, stage_ends)?;
            let to_stages = layout.to_stages(&step_senders, self.processes.as_ref(), &done, &abort);
            let mut observers = self.observers.lock().unwrap_or_else(|p| p.into_inner());
            let mut valid = self.valid.lock().unwrap_or_else(|p| p.into_inner());
            let options = self.loop_options(
                schedule,
                (layout.start, steps),
                observers.as_mut_slice(),
                valid
                    .as_deref_mut()
                    .map(|v| v as &mut dyn BatchSource<Batch = O::Batch>),
            );
            let driven = self.drive(to_stages, &mut writes, loader, options);
            drop(step_senders);
            let (results, helpers) = stage_threads.join(&layout);
            let report = finish(driven, results, helpers, &layout.local, &layout.plan);
            self.across_processes_end(report, across.as_ref())
        })
    }

    /// The communicators of `layout`'s stage threads, and whether the stages of each pipeline
    /// have a group of their own (they agree).
    fn groups_of(&self, layout: &RunLayout) -> Result<(StageGroups, bool), PipelineError> {
        // The copies of stage i (one per group) reduce their gradients in their own group.
        let timeout = self.config.timeout;
        // Clipping and mixed precision check the whole model's gradient: the stages of each
        // pipeline agree (after the reduction every pipeline holds the same gradients, so
        // each pipeline's agreement is the whole run's). Stages that share a tied parameter
        // sum its gradients over the same group; only the stages, which build the model,
        // know whether they do, so every pipeline of several stages has its group.
        let agreeing = layout.stages > 1;
        let groups = stage_groups(
            self.processes.as_ref(),
            (layout.groups, layout.stages),
            timeout,
            agreeing,
        )?;
        Ok((groups, agreeing))
    }

    /// The training loop's options: `steps` steps from `start` at the learning rates of
    /// `schedule`, told to `observers`, validated on `valid`.
    fn loop_options<'o>(
        &'o self,
        schedule: &'o LrSchedule,
        (start, steps): (TrainPosition, usize),
        observers: &'o mut [Box<dyn TrainObserver>],
        valid: Option<&'o mut dyn BatchSource<Batch = O::Batch>>,
    ) -> LoopOptions<'o, O::Batch> {
        LoopOptions {
            schedule,
            budget: Budget::Steps(steps),
            start,
            stop: self.stop.as_ref(),
            observers,
            valid,
            // Across processes, one bar: the first process's.
            progress: self.progress && self.processes.as_ref().is_none_or(|w| w.rank() == 0),
            log_epochs: self.log_epochs,
            reporting: self.objective.reporting(),
        }
    }

    /// Runs the training loop on `loader`'s batches over this process's stages (`to_stages`,
    /// the checkpoint `writes` under way); a failure raises the abort flag, so that the
    /// stages stop waiting.
    fn drive<S>(
        &self,
        to_stages: ToStages<'_, O::Batch>,
        writes: &mut Writes<'_>,
        loader: &mut S,
        options: LoopOptions<'_, O::Batch>,
    ) -> Result<(Driven, TrainReport), PipelineError>
    where
        S: BatchSource<Batch = O::Batch> + ?Sized,
    {
        let abort = to_stages.abort;
        let checkpoints = self.checkpointer.as_ref().map(|c| (c, writes));
        let mut engine = StagesEngine::new(&self.config, to_stages, checkpoints);
        let driven =
            train_loop(&mut engine, loader, options).map(|report| (engine.driven(), report));
        if driven.is_err() {
            abort.raise();
        }
        driven
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
}
