//! A launcher's options (`--max-restarts`, `--attempt-timeout`, the job after `--`): clap
//! arguments with the `clap` feature, for a program's `launch` subcommand, and the check that
//! a relaunched job resumes itself.

use std::time::Duration;

use crate::{Relaunch, RelaunchError, RelaunchReport};

/// What to launch, and how often again: torchrun's `--max-restarts` for jobs that cannot
/// restart themselves (an MPI job: `mpirun` ends every rank when one fails).
///
/// ```
/// use kiln_checkpoint::{LaunchOptions, RelaunchError};
///
/// let forgetful = LaunchOptions {
///     max_restarts: 2,
///     attempt_timeout: None,
///     job: vec!["mpirun".into(), "-np".into(), "2".into(), "train".into()],
/// };
/// // Relaunched without `--resume latest`, the job would start over each time.
/// assert!(matches!(forgetful.run(), Err(RelaunchError::NotResuming)));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct LaunchOptions {
    /// Launches after a failure.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub max_restarts: usize,
    /// Seconds a launch may run before it is killed as hung (and counted as a failure).
    #[cfg_attr(feature = "clap", arg(long, value_parser = positive_seconds))]
    pub attempt_timeout: Option<Duration>,
    /// The job's command line, after `--`.
    #[cfg_attr(feature = "clap", arg(last = true, required = true))]
    pub job: Vec<String>,
}

impl LaunchOptions {
    /// Whether the job resumes itself after a relaunch (`--resume latest` on its command line).
    pub fn resumes(&self) -> bool {
        let job = &self.job;
        job.windows(2)
            .any(|pair| pair[0] == "--resume" && pair[1] == "latest")
            || job.iter().any(|arg| arg == "--resume=latest")
    }

    /// Runs the job, and again after each failure up to `max_restarts` times.
    ///
    /// # Errors
    /// [`RelaunchError::NotResuming`] when a job that may be relaunched does not resume
    /// itself (it would be refused — its run directory holds checkpoints — or redo the work);
    /// else as [`Relaunch::run`].
    pub fn run(&self) -> Result<RelaunchReport, RelaunchError> {
        if self.max_restarts > 0 && !self.resumes() {
            return Err(RelaunchError::NotResuming);
        }
        let mut launcher = Relaunch::new(&self.job)?.max_restarts(self.max_restarts);
        if let Some(timeout) = self.attempt_timeout {
            launcher = launcher.attempt_timeout(timeout);
        }
        launcher.run()
    }
}

/// A positive number of seconds (`--attempt-timeout`).
#[cfg(any(feature = "clap", test))]
fn positive_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text.parse().map_err(|err| format!("not a number: {err}"))?;
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|timeout| !timeout.is_zero())
        .ok_or_else(|| format!("must be a positive number of seconds, not {seconds}"))
}

#[cfg(test)]
mod tests {
    use super::{LaunchOptions, positive_seconds};

    #[test]
    fn a_job_resumes_itself_with_resume_latest_in_either_spelling() {
        let job = |args: &[&str]| LaunchOptions {
            max_restarts: 1,
            attempt_timeout: None,
            job: args.iter().map(|a| a.to_string()).collect(),
        };
        assert!(job(&["train", "--resume", "latest"]).resumes());
        assert!(job(&["train", "--resume=latest"]).resumes());
        assert!(!job(&["train", "--resume", "step-8"]).resumes());
        assert!(positive_seconds("0").is_err() && positive_seconds("-3").is_err());
        assert_eq!(
            positive_seconds("1.5"),
            Ok(std::time::Duration::from_millis(1500))
        );
    }
}
