//! Restarting a whole job from outside it: what `torchrun --max-restarts` does, for jobs that
//! cannot restart themselves.
//!
//! An in-process run restarts its replicas from the latest checkpoint ([`Restarts`](crate::Restarts)).
//! An MPI job cannot: once a rank fails, MPI's communicator is gone (there is no fault-tolerant
//! MPI here) and `mpirun` ends every rank. So a launcher runs the job's command, and when it
//! fails runs it again — the job itself resumes from its latest checkpoint (`--resume latest`),
//! as it would after any crash. Each launch sees its number in [`LAUNCH_VARIABLE`].

use std::ffi::OsString;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// The environment variable that tells a launched job which launch it is: `0` for the first,
/// `k` for the k-th relaunch. A job injecting a fault for a test fires it in launch 0 only.
pub const LAUNCH_VARIABLE: &str = "KILN_LAUNCH";

/// Which launch of [`Relaunch`] this process belongs to: 0 when it was not started by one.
pub fn launch_number() -> usize {
    std::env::var(LAUNCH_VARIABLE)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Why a relaunched job did not end well.
#[derive(Debug, thiserror::Error)]
pub enum RelaunchError {
    /// No command was given.
    #[error("no command to launch")]
    NoCommand,
    /// A job that may be relaunched does not resume itself.
    #[error(
        "the job must resume itself after a relaunch: give it --run-dir, --checkpoint-every and --resume latest"
    )]
    NotResuming,
    /// The command could not be started.
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// Every launch failed.
    #[error("the job failed {launches} time(s), the last {last}; no restart left")]
    Failed {
        /// Launches made (restarts + 1).
        launches: usize,
        /// How the last one ended.
        last: String,
    },
}

/// Runs a command, and runs it again after it fails, up to `max_restarts` times.
///
/// ```
/// # #[cfg(unix)] {
/// use kiln_checkpoint::Relaunch;
///
/// let dir = std::env::temp_dir().join(format!("kiln-relaunch-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let marker = dir.join("failed-once");
/// // Fails the first time (leaving a marker, as a job leaves a checkpoint), then succeeds.
/// let script = format!("test -e {0} || {{ touch {0}; exit 3; }}", marker.display());
/// let report = Relaunch::new(["sh", "-c", &script]).unwrap().max_restarts(1).run().unwrap();
/// assert_eq!(report.restarts, 1);
/// std::fs::remove_dir_all(&dir).unwrap();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Relaunch {
    program: OsString,
    args: Vec<OsString>,
    max_restarts: usize,
    attempt_timeout: Option<Duration>,
}

/// How a relaunched job ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaunchReport {
    /// Relaunches it took (0: the first launch succeeded).
    pub restarts: usize,
}

impl Relaunch {
    /// The job `command` (its program, then its arguments), launched once unless
    /// [`max_restarts`](Self::max_restarts) says more.
    ///
    /// # Errors
    /// [`RelaunchError::NoCommand`] for an empty command.
    pub fn new<I, S>(command: I) -> Result<Self, RelaunchError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut parts = command.into_iter().map(Into::into);
        let program = parts.next().ok_or(RelaunchError::NoCommand)?;
        Ok(Self {
            program,
            args: parts.collect(),
            max_restarts: 0,
            attempt_timeout: None,
        })
    }

    /// Relaunch after a failure at most `max` times.
    pub fn max_restarts(mut self, max: usize) -> Self {
        self.max_restarts = max;
        self
    }

    /// Kill a launch that has not ended after `timeout` (a hung job), counted as a failure.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Launches the job until a launch exits with status 0 or the restarts run out; each
    /// relaunch is said on stderr with how the failed launch ended. The job's output passes
    /// through.
    ///
    /// # Errors
    /// [`RelaunchError::Spawn`] when the program cannot be started; [`RelaunchError::Failed`]
    /// when the last launch failed too.
    pub fn run(&self) -> Result<RelaunchReport, RelaunchError> {
        let mut restarts = 0;
        loop {
            let how = match self.launch(restarts)? {
                Ok(()) => return Ok(RelaunchReport { restarts }),
                Err(how) => how,
            };
            if restarts == self.max_restarts {
                return Err(RelaunchError::Failed {
                    launches: restarts + 1,
                    last: how,
                });
            }
            restarts += 1;
            eprintln!(
                "restart {restarts} of {}: the job {how}; launching it again",
                self.max_restarts
            );
        }
    }

    /// One launch, numbered `number`: `Ok` when it exited with status 0, else how it ended.
    fn launch(&self, number: usize) -> Result<Result<(), String>, RelaunchError> {
        let spawn_error = |source| RelaunchError::Spawn {
            program: self.program.to_string_lossy().into_owned(),
            source,
        };
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .env(LAUNCH_VARIABLE, number.to_string())
            .spawn()
            .map_err(spawn_error)?;
        let Some(timeout) = self.attempt_timeout else {
            return Ok(ended(child.wait().map_err(spawn_error)?));
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().map_err(spawn_error)? {
                return Ok(ended(status));
            }
            if Instant::now() >= deadline {
                // Killing a child that has just exited fails harmlessly; wait reaps it.
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Err(format!(
                    "did not end within {timeout:?} and was killed"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `Ok` for a zero exit status, else how the process ended.
fn ended(status: ExitStatus) -> Result<(), String> {
    if status.success() {
        Ok(())
    } else {
        Err(format!("ended with {status}"))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::{LAUNCH_VARIABLE, Relaunch, RelaunchError};
    use std::time::{Duration, Instant};

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-relaunch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    /// A job that fails until it has run `failures` times (counting its runs in a file), and
    /// checks that it is told its launch number.
    fn flaky(dir: &std::path::Path, failures: usize) -> Vec<String> {
        let count = dir.join("runs");
        let script = format!(
            "n=$(cat {c} 2>/dev/null || echo 0); test \"${LAUNCH_VARIABLE}\" = \"$n\" || exit 99; \
             echo $((n + 1)) > {c}; test $n -ge {failures} || exit 3",
            c = count.display()
        );
        vec!["sh".into(), "-c".into(), script]
    }

    #[test]
    fn a_failed_job_is_launched_again_until_it_succeeds() {
        let dir = scratch("again");
        let report = Relaunch::new(flaky(&dir, 2))
            .expect("a command")
            .max_restarts(3)
            .run()
            .expect("the third launch succeeds");
        assert_eq!(report.restarts, 2);
        assert_eq!(
            std::fs::read_to_string(dir.join("runs")).unwrap().trim(),
            "3"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_last_failure_is_the_error_when_restarts_run_out() {
        // The control: with one restart fewer than it needs, the job is reported failed.
        let dir = scratch("out");
        let err = Relaunch::new(flaky(&dir, 2))
            .expect("a command")
            .max_restarts(1)
            .run()
            .expect_err("two launches fail");
        match &err {
            RelaunchError::Failed { launches, last } => {
                assert_eq!(*launches, 2);
                assert!(last.contains("exit status: 3"), "{last}");
            }
            other => panic!("unexpected {other}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_hung_launch_is_killed_at_its_timeout() {
        let start = Instant::now();
        let err = Relaunch::new(["sleep", "30"])
            .expect("a command")
            .attempt_timeout(Duration::from_millis(300))
            .run()
            .expect_err("killed");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert!(err.to_string().contains("was killed"), "{err}");
    }

    #[test]
    fn bad_commands_are_errors() {
        assert!(matches!(
            Relaunch::new(Vec::<String>::new()),
            Err(RelaunchError::NoCommand)
        ));
        let err = Relaunch::new(["/nonexistent/kiln-job"])
            .unwrap()
            .run()
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kiln-job"), "{err}");
    }
}
