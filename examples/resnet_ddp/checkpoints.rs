//! The run (data parallel or pipelined) recorded, saved and resumed: what identifies it, and
//! the option whose state a checkpoint does not hold. `--run-dir` and the other checkpoint
//! options are kiln's `RunOptions`.

use kiln::checkpoint::{Attempt, RunIdentity};

use crate::Setup;
use crate::args::{Args, CommArg};

/// Refuses checkpoint options this run cannot honour: restarts of an MPI job from inside
/// it, and checkpoints of local SGD (its replicas differ between averagings, which a
/// checkpoint does not hold yet).
pub fn refuse_conflicts(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    args.run.check()?;
    args.run.check_processes(args.comm == CommArg::Mpi)?;
    if !saveable(args)
        && let Some(note) = args
            .run
            .refuse_checkpoints("--local-sgd", "replicas differ between averagings")?
    {
        println!("{note}");
    }
    Ok(())
}

/// The model, as checkpoints, profiles and plans name it.
pub fn model_name(args: &Args) -> String {
    format!(
        "resnet{} width {} cifar-stem 10 classes",
        args.model, args.width
    )
}

/// What identifies this run: the model and every option that changes the arithmetic.
///
/// The replica count, the split and ZeRO-1 are not part of it (elastic resume): every
/// step's samples are the same contiguous run of the epoch's order whatever the split, and
/// a ZeRO-1 checkpoint's optimizer parts join into the state one optimizer would hold.
pub fn identity(args: &Args, step_samples: usize, steps: usize) -> RunIdentity {
    RunIdentity::new(model_name(args))
        .with("lr", args.lr)
        .with("lr scaling", format!("{:?}", args.lr_scaling))
        .with("samples per step", step_samples)
        .with("accumulation", args.step.accumulation)
        .with("total steps", steps)
        .with("seed", args.seed)
        .with(
            "data",
            args.data.as_ref().map_or_else(
                || format!("synthetic {}", args.synthetic_samples),
                |dir| dir.display().to_string(),
            ),
        )
        .with("optimizer", "sgd momentum 0.9 weight decay 5e-4")
        .with("compression", format!("{:?}", args.ddp.compression))
        .with("sync bn", args.ddp.sync_bn)
        .with("clip grad norm", format!("{:?}", args.step.clip_grad_norm))
        .with("precision", format!("{:?}", args.step.amp))
}

/// Whether a checkpoint can hold this run's state (local SGD's replicas differ between
/// averagings, which it does not hold yet).
pub fn saveable(args: &Args) -> bool {
    args.ddp.local_sgd.is_none()
}

/// This attempt of the run (from `setup`'s checkpoint, stopping at its SIGTERM flag), with
/// the devices in every checkpoint's layout; saving nothing when the state cannot be held.
pub fn attempt(args: &Args, setup: &Setup, step_samples: usize, steps: usize) -> Attempt {
    let identity = identity(args, step_samples, steps);
    let from = setup.resume_from.as_deref();
    let attempt =
        (args.run.attempt(&identity, from, setup.stop.as_ref())).layout("devices", &args.devices);
    match saveable(args) {
        true => attempt,
        false => attempt.without_checkpoints(),
    }
}

/// Writes the resolved options (and the plan, when there is one) into the run directory.
pub fn record_config(args: &Args, plan: Option<&kiln::planner::Plan>) -> Result<(), String> {
    let record =
        |name: &str, text: String| args.run.record(name, &text).map_err(|err| err.to_string());
    record("config.txt", format!("{args:#?}\n"))?;
    plan.map_or(Ok(()), |plan| record("plan.json", plan.to_json()))
}
