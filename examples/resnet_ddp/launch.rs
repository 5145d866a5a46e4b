//! `launch`: a job (an `mpirun` command line) run, and run again after it fails.

use std::time::Duration;

use kiln::checkpoint::Relaunch;

/// Runs `job` with up to `max_restarts` relaunches; whether it finally succeeded.
pub fn run(job: &[String], max_restarts: usize, attempt_timeout: Option<f64>) -> bool {
    match relaunch(job, max_restarts, attempt_timeout) {
        Ok(restarts) => {
            eprintln!("launch: the job succeeded after {restarts} restart(s)");
            true
        }
        Err(err) => {
            eprintln!("error: {err}");
            false
        }
    }
}

fn relaunch(
    job: &[String],
    max_restarts: usize,
    attempt_timeout: Option<f64>,
) -> Result<usize, Box<dyn std::error::Error>> {
    // A relaunch that started over would be refused (its run directory holds checkpoints)
    // or would redo the work: the job must resume itself.
    let resumes = job
        .windows(2)
        .any(|pair| pair[0] == "--resume" && pair[1] == "latest")
        || job.iter().any(|arg| arg == "--resume=latest");
    if max_restarts > 0 && !resumes {
        return Err("the job must resume itself after a relaunch: give it --run-dir, --checkpoint-every and --resume latest".into());
    }
    let mut launcher = Relaunch::new(job)?.max_restarts(max_restarts);
    if let Some(seconds) = attempt_timeout {
        let timeout = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or("--attempt-timeout must be a positive number of seconds")?;
        launcher = launcher.attempt_timeout(timeout);
    }
    Ok(launcher.run()?.restarts)
}
