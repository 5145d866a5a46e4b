//! What a kiln program can do instead of training — check the machine (`doctor`), check
//! data-parallel training on its devices (`selftest`), run a job again after it fails
//! (`launch`) — as one set of subcommands any program takes (clap's `Subcommand` with the
//! `clap` feature).

use kiln_checkpoint::LaunchOptions;
use kiln_ddp::SelfTest;

use super::Doctor;

/// A task instead of training.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Subcommand))]
pub enum Task {
    /// Check what this build and machine can do: compiled features, the CPU, every device
    /// `--devices` names (opened and used), CUDA's libraries, wgpu adapters, MPI (`--comm mpi`
    /// or under mpirun), an all-reduce bandwidth; a fix for each problem. Exits non-zero when a
    /// named device cannot be used.
    Doctor,
    /// Check data-parallel training on `--devices` against one device (f32 and half
    /// precision, host and device gradient paths, with a control that must fail); exits
    /// non-zero on a failure. On a GPU node: `selftest --devices cuda:0,cuda:0`.
    Selftest,
    /// Run a job and launch it again after it fails, like `torchrun --max-restarts`: for MPI
    /// jobs, which cannot restart themselves (`mpirun` ends every rank when one fails). The
    /// job resumes itself, so it needs `--run-dir`, `--checkpoint-every` and `--resume latest`:
    /// `launch --max-restarts 2 -- mpirun -np 2 PROGRAM --comm mpi --devices cpu
    /// --run-dir runs/a --checkpoint-every 50 --resume latest`.
    Launch(LaunchOptions),
}

impl Task {
    /// Runs the task for a program training on the devices `devices` names (its `--devices`;
    /// `mpi`: it trains under MPI, which the doctor then requires), printing what it finds;
    /// whether it passed.
    pub fn run(&self, devices: &str, mpi: bool) -> bool {
        match self {
            Task::Doctor => {
                let checkup = Doctor::new(devices).require_mpi(mpi).check();
                print!("{checkup}");
                checkup.passed()
            }
            Task::Selftest => match SelfTest::on(devices).and_then(|test| test.run()) {
                Ok(report) => {
                    println!("{report}");
                    report.passed()
                }
                Err(err) => {
                    println!("selftest: {err}");
                    false
                }
            },
            Task::Launch(launch) => match launch.run() {
                Ok(done) => {
                    eprintln!(
                        "launch: the job succeeded after {} restart(s)",
                        done.restarts
                    );
                    true
                }
                Err(err) => {
                    eprintln!("error: {err}");
                    false
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Task;

    #[test]
    fn the_selftest_passes_on_cpu_replicas_and_fails_on_a_missing_device() {
        assert!(Task::Selftest.run("cpu:0,cpu:1", false));
        if !cfg!(feature = "cuda") {
            assert!(!Task::Selftest.run("cuda:0", false));
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_launch_passes_when_its_job_does_and_refuses_a_job_that_would_start_over() {
        let job = |args: &[&str], max_restarts| {
            Task::Launch(kiln_checkpoint::LaunchOptions {
                max_restarts,
                attempt_timeout: None,
                job: args.iter().map(|a| a.to_string()).collect(),
            })
        };
        assert!(job(&["true"], 0).run("cpu", false));
        assert!(!job(&["false"], 0).run("cpu", false));
        assert!(!job(&["true"], 1).run("cpu", false), "no --resume latest");
    }
}
