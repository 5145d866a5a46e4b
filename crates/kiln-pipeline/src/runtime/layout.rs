//! A run's layout in this process: the pipelines' shape, the schedule, this process's stage
//! threads, their start and devices, checked and worked out before any thread starts.

use burn::tensor::Device;
use crossbeam_channel::{Receiver, Sender};
use kiln_checkpoint::Manifest;
use kiln_comm::Communicator;
use kiln_train::{Objective, TrainPosition};

use crate::runtime::PipelineError;
use crate::runtime::checkpoint::agree_start;
use crate::runtime::engine::ToStages;
use crate::runtime::mailbox::Abort;
use crate::runtime::pipeline::Pipeline;
use crate::runtime::transfer;
use crate::runtime::worker::{StepData, StepDone};
use crate::schedule::Schedule;

/// How a run is laid out, seen from this process.
pub(crate) struct RunLayout {
    /// Data-parallel pipelines (D).
    pub groups: usize,
    /// Stages per pipeline (P).
    pub stages: usize,
    /// Stage threads over all processes (D × P).
    pub total: usize,
    /// The schedule every pipeline follows.
    pub plan: Schedule,
    /// This process's stage threads, by index in (group, stage) order over all processes.
    pub local: Vec<usize>,
    /// Where training starts (across processes, the same for every one).
    pub start: TrainPosition,
    /// Threads of each stage's pool.
    pub threads: usize,
    /// Whether the pools' idle threads poll for work (`kiln_core::warm_pool`).
    pub warm: bool,
    /// Each stage thread's training device, in (group, stage) order.
    pub devices: Vec<Device>,
    /// Whether every neighbouring pair of stages sends through a courier (tests only).
    pub always: bool,
    /// Whether sends between this process's stages go through couriers (stages on several
    /// devices, or `always`).
    pub mixed: bool,
}

impl RunLayout {
    /// The driver's view of the stage threads: its ends of their channels (`step_senders`,
    /// `done`), the world across processes and the run's abort flag.
    pub(crate) fn to_stages<'a, B>(
        &'a self,
        step_senders: &'a [Sender<StepData<B>>],
        across: Option<&'a Communicator>,
        done: &'a Receiver<StepDone>,
        abort: &'a Abort,
    ) -> ToStages<'a, B> {
        ToStages {
            step_senders,
            threads: &self.local,
            total: self.total,
            across,
            done,
            abort,
            stages: self.stages,
        }
    }
}

impl<O: Objective> Pipeline<O> {
    /// Checks the configuration and lays the run out: the errors of a bad configuration, a
    /// schedule that cannot be built, a checkpoint that does not resume this run, or a world
    /// that does not fit the pipelines.
    pub(crate) fn run_layout(&self) -> Result<RunLayout, PipelineError> {
        self.config.validate()?;
        let start = self.resume_position();
        let (groups, stages) = self.pipeline_shape()?;
        let total = self.devices.len();
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
        // Stages on several devices (in this process): the micro-batches move to the first
        // and last stages' devices, and values between stages to the receiver's.
        let devices: Vec<Device> = self
            .devices
            .iter()
            .map(|device| self.config.train_device(device))
            .collect();
        let always = self.couriers_always();
        let mixed = self.processes.is_none() && (always || transfer::mixed(&devices));
        Ok(RunLayout {
            groups,
            stages,
            total,
            plan,
            local,
            start,
            threads,
            warm,
            devices,
            always,
            mixed,
        })
    }

    /// The pipelines' shape, (data-parallel pipelines, stages per pipeline), once the devices
    /// and the emulated slowdowns fit it.
    fn pipeline_shape(&self) -> Result<(usize, usize), PipelineError> {
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
        Ok((groups, stages))
    }

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
        // Clipping, mixed precision and checkpoints work: the stages agree over the world.
        #[cfg(feature = "mpi")]
        return crate::runtime::processes::check(world, stages, groups);
        #[cfg(not(feature = "mpi"))]
        {
            let _ = (world, stages, groups);
            Err(PipelineError::Config(
                "stages across processes need kiln built with its `mpi` feature".into(),
            ))
        }
    }

    /// Where a resumed run starts: the checkpoint's position, once its manifest is read and
    /// its run is this one (each stage checks every file when it loads its part).
    fn resume_position(&self) -> Result<TrainPosition, PipelineError> {
        let Some((path, identity)) = &self.resume else {
            return Ok(TrainPosition::default());
        };
        let manifest = Manifest::read(path).map_err(PipelineError::checkpoint)?;
        let differences = identity.differences(&manifest.run);
        if !differences.is_empty() {
            return Err(PipelineError::checkpoint(format!(
                "the checkpoint {} does not match this run: {}",
                path.display(),
                differences.join("; ")
            )));
        }
        Ok(manifest.position.into())
    }
}
