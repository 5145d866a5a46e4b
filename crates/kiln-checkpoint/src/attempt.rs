//! One attempt of a run — the first, or a restart from the latest checkpoint — as every
//! replica's trainer and every pipeline wire it in: where it resumes, where it saves, the
//! SIGTERM flag and the run's log. Data-parallel replicas and pipeline stages take the same
//! attempt, so a run resumes under any plan with the same options.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use kiln_train::{
    GradientStep, Objective, RunLog, StopFlag, TrainError, TrainPosition, TrainerBuilder,
};

use crate::{CheckpointError, Checkpointer, Manifest, RunIdentity, RunOptions, RunStart};

/// One attempt of a run ([`RunOptions::attempt`]): what its replicas or its pipeline start
/// from and save into.
///
/// ```
/// use kiln_checkpoint::{RunIdentity, RunOptions};
///
/// let dir = std::env::temp_dir().join(format!("kiln-doc-attempt-{}", std::process::id()));
/// let options = RunOptions { run_dir: Some(dir.clone()), ..RunOptions::default() };
/// let identity = RunIdentity::new("my model").with("lr", 0.1);
/// let attempt = options.attempt(&identity, None, None).layout("devices", "cpu:0,cpu:1");
/// assert!(attempt.checkpointer().is_some(), "a run directory: saved at the end");
/// assert!(attempt.resume_position()?.step == 0, "a fresh start");
/// assert!(attempt.clone().without_checkpoints().checkpointer().is_none());
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), kiln_checkpoint::CheckpointError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Attempt {
    options: RunOptions,
    identity: RunIdentity,
    from: Option<PathBuf>,
    stop: Option<StopFlag>,
    saves: bool,
    layout: Vec<(String, String)>,
}

impl RunOptions {
    /// An attempt of the run `identity` names, from the checkpoint `from` (`None`: fresh;
    /// [`RunOptions::with_restarts`] gives each attempt's), stopping at `stop`'s raise
    /// ([`RunOptions::stop_on_sigterm`]).
    pub fn attempt(
        &self,
        identity: &RunIdentity,
        from: Option<&Path>,
        stop: Option<&StopFlag>,
    ) -> Attempt {
        Attempt {
            options: self.clone(),
            identity: identity.clone(),
            from: from.map(Path::to_path_buf),
            stop: stop.cloned(),
            saves: true,
            layout: Vec::new(),
        }
    }
}

impl Attempt {
    /// Saves no checkpoint (state a checkpoint cannot hold yet, such as local SGD's
    /// replicas between averagings): the run directory gets its log and curves only.
    pub fn without_checkpoints(mut self) -> Self {
        self.saves = false;
        self
    }

    /// Records `name = value` in every checkpoint's layout (the devices, the plan): for the
    /// reader, not checked on resume (any layout resumes).
    pub fn layout(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.layout.push((name.into(), value.to_string()));
        self
    }

    /// The run, as its checkpoints name it.
    pub fn identity(&self) -> &RunIdentity {
        &self.identity
    }

    /// The checkpoint this attempt resumes from; `None` for a fresh start.
    pub fn resumes_from(&self) -> Option<&Path> {
        self.from.as_deref()
    }

    /// The flag that stops the attempt at its next step, saved.
    pub fn stop_flag(&self) -> Option<&StopFlag> {
        self.stop.as_ref()
    }

    /// The checkpointer, with a run directory and state a checkpoint holds.
    pub fn checkpointer(&self) -> Option<Checkpointer> {
        if !self.saves {
            return None;
        }
        let saver = self.options.checkpointer(&self.identity)?;
        Some((self.layout.iter()).fold(saver, |saver, (name, value)| saver.layout(name, value)))
    }

    /// The metrics log, continuing from `position` (for the one replica or process that logs).
    ///
    /// # Errors
    /// When the log cannot be opened.
    pub fn run_log(&self, position: &TrainPosition) -> Result<Option<RunLog>, TrainError> {
        self.options.run_log(position)
    }

    /// Where the attempt starts: the checkpoint's position (its manifest read), or step 0.
    ///
    /// # Errors
    /// When the manifest cannot be read.
    pub fn resume_position(&self) -> Result<TrainPosition, CheckpointError> {
        match &self.from {
            Some(path) => Ok(Manifest::read(path)?.position.into()),
            None => Ok(TrainPosition::default()),
        }
    }

    /// The line a run prints when it resumes: the checkpoint and its position.
    pub fn resume_line(&self, position: &TrainPosition) -> Option<String> {
        let path = self.from.as_ref()?;
        Some(format!(
            "resume: {} (step {}, epoch {}, step {} of it)",
            path.display(),
            position.step,
            position.epoch,
            position.step_in_epoch
        ))
    }

    /// A replica's model, optimizer and position: the checkpoint's (checked against the
    /// run's identity), or `model` and `optimizer` as given; `owned`: the parameters whose
    /// optimizer state the replica keeps (ZeRO-1), all when `None`.
    ///
    /// # Errors
    /// As [`start_from`](crate::start_from).
    pub fn start<M: Module>(
        &self,
        model: M,
        optimizer: ModuleOptimizer,
        owned: Option<&[String]>,
    ) -> Result<RunStart<M>, CheckpointError> {
        crate::start_from(self.resumes_from(), &self.identity, model, optimizer, owned)
    }

    /// `builder` for replica `rank` of `world` in this attempt: resumed at `position`,
    /// saving its part of each checkpoint (`sharded`: its ZeRO-1 optimizer shard), stopping
    /// at the flag; replica 0 writes the run's log.
    ///
    /// # Panics
    /// If `rank` is not below `world` (a programmer's error).
    pub fn replica_trainer<M, S, O>(
        &self,
        builder: TrainerBuilder<M, S, O>,
        position: &TrainPosition,
        (rank, world): (usize, usize),
        sharded: bool,
    ) -> Result<TrainerBuilder<M, S, O>, TrainError>
    where
        M: Module + 'static,
        O: Objective,
        S: GradientStep<M, O::Batch>,
    {
        let mut builder = builder.resume_at(*position);
        if let Some(saver) = self.checkpointer() {
            builder = builder.checkpoint(saver.for_replica(rank, world, sharded));
        }
        if let Some(flag) = &self.stop {
            builder = builder.stop_flag(flag.clone());
        }
        if rank == 0
            && let Some(log) = self.run_log(position)?
        {
            builder = builder.observer(log);
        }
        Ok(builder)
    }
}
