//! The options every training command takes for its run directory — where checkpoints, the
//! metrics log and the configuration go, how often to save, what to resume, how often to
//! restart — checked together, and turned into the store, checkpointer, resume point, log,
//! SIGTERM flag and restart loop a run needs. With the `clap` feature they flatten into a
//! command line: `#[command(flatten)] run: RunOptions` gives `--run-dir`,
//! `--checkpoint-every`, `--keep`, `--resume` and `--max-restarts`.

use std::path::{Path, PathBuf};

use kiln_train::{RunLog, StopFlag, TrainError, TrainPosition};

use crate::{CheckpointError, CheckpointStore, Checkpointer, Restarts, ResumeFrom, RunIdentity};

/// Where checkpoints go inside the run directory.
const CHECKPOINTS: &str = "checkpoints";

/// A run's directory and its checkpoint options (the field names are the flags' names).
///
/// ```
/// use kiln_checkpoint::{ResumeFrom, RunIdentity, RunOptions};
///
/// let dir = std::env::temp_dir().join(format!("kiln-doc-run-options-{}", std::process::id()));
/// let options = RunOptions {
///     run_dir: Some(dir.clone()),
///     checkpoint_every: Some(100),
///     resume: Some(ResumeFrom::Latest),
///     ..RunOptions::default()
/// };
/// options.check()?;
/// assert_eq!(options.resume_from()?, None, "nothing saved yet: a fresh start");
/// let saver = options.checkpointer(&RunIdentity::new("my model").with("lr", 0.1));
/// assert!(saver.is_some());
/// let broken = RunOptions { run_dir: None, ..options };
/// assert!(broken.check().unwrap_err().to_string().contains("--checkpoint-every needs --run-dir"));
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), kiln_checkpoint::CheckpointError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct RunOptions {
    /// The run's directory: `metrics.jsonl` (every step and epoch), `curves.svg` (loss,
    /// accuracy and learning rate, redrawn every epoch), the configuration, and checkpoints
    /// (`checkpoints/step-N/`, the newest --keep kept; without --checkpoint-every, one at
    /// the end).
    #[cfg_attr(feature = "clap", arg(long))]
    pub run_dir: Option<PathBuf>,
    /// Save a checkpoint every N optimizer steps (and after the last), into --run-dir.
    #[cfg_attr(feature = "clap", arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub checkpoint_every: Option<usize>,
    /// Checkpoints kept in --run-dir (the newest).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub keep: usize,
    /// Resume from `latest` (the newest checkpoint in --run-dir that verifies; none yet:
    /// start fresh and say so) or from a checkpoint directory. The model, data and every
    /// option that changes the arithmetic must match the checkpoint's; the plan need not.
    #[cfg_attr(feature = "clap", arg(long))]
    pub resume: Option<ResumeFrom>,
    /// When training fails (an error or a panic), restart it from the latest checkpoint in
    /// --run-dir, up to this many times (in one process; a job of several processes restarts
    /// from outside, with `kiln_checkpoint::Relaunch`).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub max_restarts: usize,
}

impl Default for RunOptions {
    /// No directory: nothing saved, logged or resumed; 3 checkpoints kept once there is one.
    fn default() -> Self {
        Self {
            run_dir: None,
            checkpoint_every: None,
            keep: 3,
            resume: None,
            max_restarts: 0,
        }
    }
}

impl RunOptions {
    /// Refuses options that cannot be honoured together (each would otherwise be ignored).
    ///
    /// # Errors
    /// [`CheckpointError::Options`], naming the flags.
    pub fn check(&self) -> Result<(), CheckpointError> {
        let refuse = |reason: &str| {
            Err(CheckpointError::Options {
                reason: reason.into(),
            })
        };
        if self.checkpoint_every == Some(0) {
            return refuse("--checkpoint-every must be at least 1");
        }
        if self.keep == 0 {
            return refuse("--keep must be at least 1 (the checkpoint a resume starts from)");
        }
        if self.checkpoint_every.is_some() && self.run_dir.is_none() {
            return refuse("--checkpoint-every needs --run-dir (where the checkpoints go)");
        }
        if self.resume == Some(ResumeFrom::Latest) && self.run_dir.is_none() {
            return refuse("--resume latest needs --run-dir (where to look)");
        }
        if self.max_restarts > 0 && self.checkpoint_every.is_none() {
            return refuse(
                "--max-restarts needs --run-dir and --checkpoint-every (restarts resume from the latest checkpoint)",
            );
        }
        Ok(())
    }

    /// Refuses `--max-restarts` in a job of several processes (`across_processes`): when a
    /// rank fails, `mpirun` ends the job, which restarts from outside instead
    /// ([`LaunchOptions`](crate::LaunchOptions), a program's `launch` subcommand).
    ///
    /// # Errors
    /// [`CheckpointError::Options`] saying how to restart such a job.
    pub fn check_processes(&self, across_processes: bool) -> Result<(), CheckpointError> {
        if self.max_restarts > 0 && across_processes {
            return Err(CheckpointError::Options {
                reason: "--max-restarts restarts in-process runs; a job of several processes restarts from outside mpirun: `launch --max-restarts N -- mpirun ... --resume latest`".into(),
            });
        }
        Ok(())
    }

    /// For a run whose state a checkpoint cannot hold yet (`what`, e.g. `--local-sgd`, and
    /// `why`: its replicas differ between averagings): refuses `--checkpoint-every` and
    /// `--resume`, and with `--run-dir` returns the note that says what it still records.
    ///
    /// # Errors
    /// [`CheckpointError::Options`] naming `what` and `why`.
    pub fn refuse_checkpoints(
        &self,
        what: &str,
        why: &str,
    ) -> Result<Option<String>, CheckpointError> {
        if self.checkpoint_every.is_some() || self.resume.is_some() {
            return Err(CheckpointError::Options {
                reason: format!(
                    "checkpoints (--checkpoint-every, --resume) do not support {what} yet: {why}"
                ),
            });
        }
        Ok(self.run_dir.as_ref().map(|_| {
            format!("note: --run-dir records metrics and curves; no checkpoint is saved with {what} (not supported yet)")
        }))
    }

    /// The run's checkpoints (`RUN_DIR/checkpoints`, the newest `keep` kept), with a directory.
    pub fn store(&self) -> Option<CheckpointStore> {
        let dir = self.run_dir.as_ref()?;
        Some(CheckpointStore::new(dir.join(CHECKPOINTS), self.keep))
    }

    /// The checkpoint to start from: `--resume`'s path, the latest whole one, or `None` for
    /// the beginning (`latest` before the first checkpoint says so on stdout).
    ///
    /// # Errors
    /// [`CheckpointError::Occupied`] for a fresh run in a directory that holds checkpoints
    /// (with how to continue it), and the store's errors.
    pub fn resume_from(&self) -> Result<Option<PathBuf>, CheckpointError> {
        let from = self.resume.clone().unwrap_or_default();
        let store = self.store();
        let resolved = from.resolve(store.as_ref()).map_err(|err| match err {
            CheckpointError::Occupied { .. } => CheckpointError::Options {
                reason: format!("{err} (--resume latest continues it; or pass another --run-dir)"),
            },
            err => err,
        })?;
        if let (ResumeFrom::Latest, None, Some(store)) = (&from, &resolved, &store) {
            println!(
                "resume: no checkpoint in {} yet, starting fresh",
                store.dir().display()
            );
        }
        Ok(resolved)
    }

    /// The run's checkpointer (every `--checkpoint-every` steps, else at the end only), with a
    /// directory; `identity` names the run, for a checkpoint to refuse another's.
    pub fn checkpointer(&self, identity: &RunIdentity) -> Option<Checkpointer> {
        let every = self.checkpoint_every.unwrap_or(0);
        Some(Checkpointer::new(self.store()?, every, identity.clone()))
    }

    /// Runs `attempt` from `start`, and again from the newest checkpoint that verifies after
    /// each failure, up to `--max-restarts` times ([`Restarts`]); once without a directory.
    ///
    /// # Errors
    /// The last attempt's error, or the store's.
    pub fn with_restarts<T, E>(
        &self,
        start: Option<PathBuf>,
        mut attempt: impl FnMut(Option<&Path>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: std::fmt::Display + From<CheckpointError>,
    {
        match self.store() {
            Some(store) => Restarts::new(&store, self.max_restarts).run(start, attempt),
            None => attempt(start.as_deref()),
        }
    }

    /// The metrics log and curves in the run directory, continuing from `position` (a resumed
    /// run keeps its earlier lines); for the one process or replica that logs.
    ///
    /// # Errors
    /// When the log cannot be opened.
    pub fn run_log(&self, position: &TrainPosition) -> Result<Option<RunLog>, TrainError> {
        let Some(dir) = &self.run_dir else {
            return Ok(None);
        };
        RunLog::open(dir, position.step).map(Some)
    }

    /// With a directory, a flag SIGTERM raises (a preempted job): the trainer stops at the
    /// next step with a checkpoint and returns. Without one, SIGTERM keeps its meaning (end
    /// the process): there is nowhere to save. Install it before starting other threads.
    ///
    /// # Errors
    /// When the handler cannot be installed.
    pub fn stop_on_sigterm(&self) -> Result<Option<StopFlag>, CheckpointError> {
        if self.run_dir.is_none() {
            return Ok(None);
        }
        #[cfg(unix)]
        {
            StopFlag::on_sigterm()
                .map(Some)
                .map_err(CheckpointError::io("the SIGTERM handler"))
        }
        #[cfg(not(unix))]
        {
            Ok(None)
        }
    }

    /// Writes `contents` as `name` in the run directory (the resolved options, a plan), with
    /// a directory.
    ///
    /// # Errors
    /// When the directory or the file cannot be written.
    pub fn record(&self, name: &str, contents: &str) -> Result<(), CheckpointError> {
        let Some(dir) = &self.run_dir else {
            return Ok(());
        };
        std::fs::create_dir_all(dir).map_err(CheckpointError::io(dir))?;
        let path = dir.join(name);
        std::fs::write(&path, contents).map_err(CheckpointError::io(path))
    }
}
