//! `--run-dir`, `--checkpoint-every`, `--resume`: the run (data parallel or pipelined)
//! recorded, saved and resumed.

use std::path::PathBuf;

use burn::optim::ModuleOptimizer;
use kiln::checkpoint::{
    CheckpointError, CheckpointStore, Checkpointer, Restarts, ResumeFrom, RunIdentity, RunStart,
    start_from,
};
use kiln::resnet::ResNet;
use kiln::train::{RunLog, TrainError, TrainPosition};

use crate::args::Args;

/// The options whose state a checkpoint does not hold yet (set ones, by flag): local SGD's
/// replicas, which differ between averagings.
fn unsupported(args: &Args) -> Vec<&'static str> {
    [(args.local_sgd.is_some(), "--local-sgd")]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| name)
        .collect()
}

/// Refuses checkpoint options this run cannot honour, and checkpoint options without
/// --run-dir.
pub fn refuse_conflicts(args: &Args) -> Result<(), String> {
    if args.checkpoint_every.is_some() && args.run_dir.is_none() {
        return Err("--checkpoint-every needs --run-dir (where the checkpoints go)".into());
    }
    if args.resume.as_deref() == Some("latest") && args.run_dir.is_none() {
        return Err("--resume latest needs --run-dir (where to look)".into());
    }
    if args.max_restarts > 0 && args.checkpoint_every.is_none() {
        return Err("--max-restarts needs --run-dir and --checkpoint-every (restarts resume from the latest checkpoint)".into());
    }
    if args.max_restarts > 0 && args.comm == crate::args::CommArg::Mpi {
        return Err("--max-restarts restarts in-process runs; an MPI job restarts from outside mpirun: `resnet_ddp launch --max-restarts N -- mpirun ... --resume latest`".into());
    }
    let named = unsupported(args);
    if (args.checkpoint_every.is_some() || args.resume.is_some()) && !named.is_empty() {
        return Err(format!(
            "checkpoints (--checkpoint-every, --resume) do not support {} yet: replicas differ between averagings",
            named.join(", ")
        ));
    }
    if args.run_dir.is_some() && !named.is_empty() {
        println!(
            "note: --run-dir records metrics and curves; no checkpoint is saved with {} (not supported yet)",
            named.join(", ")
        );
    }
    Ok(())
}

/// What identifies this run: the model and every option that changes the arithmetic.
///
/// The replica count, the split and ZeRO-1 are not part of it (elastic resume): every
/// step's samples are the same contiguous run of the epoch's order whatever the split, and
/// a ZeRO-1 checkpoint's optimizer parts join into the state one optimizer would hold.
pub fn identity(args: &Args, step_samples: usize, steps: usize) -> RunIdentity {
    RunIdentity::new(format!(
        "resnet{} width {} cifar-stem 10 classes",
        args.model, args.width
    ))
    .with("lr", args.lr)
    .with("lr scaling", format!("{:?}", args.lr_scaling))
    .with("samples per step", step_samples)
    .with("accumulation", args.accumulation)
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
    .with("compression", format!("{:?}", args.compression))
    .with("sync bn", args.sync_bn)
    .with("clip grad norm", format!("{:?}", args.clip_grad_norm))
    .with("precision", format!("{:?}", args.amp))
}

/// The checkpoint to resume from, if any (`--resume latest` without one: none, said).
pub fn resume_from(args: &Args) -> Result<Option<PathBuf>, String> {
    let from = args
        .resume
        .as_deref()
        .map_or(ResumeFrom::Fresh, |text| match text.parse() {
            Ok(from) => from,
            Err(never) => match never {},
        });
    let store = store(args);
    let resolved = from.resolve(store.as_ref()).map_err(|err| match err {
        CheckpointError::Occupied { .. } => {
            format!("{err} (--resume latest continues it; or pass another --run-dir)")
        }
        err => err.to_string(),
    })?;
    if let (ResumeFrom::Latest, None, Some(store)) = (&from, &resolved, &store) {
        println!(
            "resume: no checkpoint in {} yet, starting fresh",
            store.dir().display()
        );
    }
    Ok(resolved)
}

/// Runs `attempt` (from `start`), restarted from the latest checkpoint after a failure up to
/// `--max-restarts` times (checked: restarts have a run directory to resume from).
pub fn with_restarts<T>(
    args: &Args,
    start: Option<PathBuf>,
    mut attempt: impl FnMut(Option<&std::path::Path>) -> Result<T, Box<dyn std::error::Error>>,
) -> Result<T, Box<dyn std::error::Error>> {
    match store(args) {
        Some(store) => Restarts::new(&store, args.max_restarts).run(start, attempt),
        // Without a run directory nothing restarts (checked by `refuse_conflicts`).
        None => attempt(start.as_deref()),
    }
}

fn store(args: &Args) -> Option<CheckpointStore> {
    args.run_dir
        .as_ref()
        .map(|dir| CheckpointStore::new(dir.join("checkpoints"), args.keep))
}

/// A replica's checkpointer, if the run has a directory and its state can be saved.
pub fn saver(args: &Args, identity: &RunIdentity, devices: &str) -> Option<Checkpointer> {
    if !unsupported(args).is_empty() {
        return None;
    }
    store(args).map(|store| {
        Checkpointer::new(store, args.checkpoint_every.unwrap_or(0), identity.clone())
            .layout("devices", devices)
    })
}

/// Where a replica starts: `--resume`'s checkpoint (said by the primary replica), or fresh;
/// `owned`: the parameters whose optimizer state it keeps (ZeRO-1), all when `None`.
pub fn start(
    setup: &crate::Setup,
    identity: &RunIdentity,
    model: ResNet,
    optimizer: ModuleOptimizer,
    owned: Option<&[String]>,
    primary: bool,
) -> Result<RunStart<ResNet>, TrainError> {
    let from = setup.resume_from.as_deref();
    let start =
        start_from(from, identity, model, optimizer, owned).map_err(TrainError::checkpoint)?;
    if primary && let Some(path) = &start.resumed_from {
        let position = &start.position;
        println!(
            "resume: {} (step {}, epoch {}, step {} of it)",
            path.display(),
            position.step,
            position.epoch,
            position.step_in_epoch
        );
    }
    Ok(start)
}

/// The primary replica's log of metrics and curves in the run directory, continuing from
/// `position` (a resumed run keeps its earlier lines).
pub fn run_log(args: &Args, position: &TrainPosition) -> Result<Option<RunLog>, TrainError> {
    args.run_dir
        .as_ref()
        .map(|dir| RunLog::open(dir, position.step))
        .transpose()
}

/// Writes the resolved options (and the plan, when there is one) into the run directory.
pub fn record_config(args: &Args, plan: Option<&kiln::planner::Plan>) -> Result<(), String> {
    let Some(dir) = &args.run_dir else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(|err| format!("{}: {err}", dir.display()))?;
    let config = dir.join("config.txt");
    std::fs::write(&config, format!("{args:#?}\n"))
        .map_err(|err| format!("{}: {err}", config.display()))?;
    if let Some(plan) = plan {
        let path = dir.join("plan.json");
        std::fs::write(&path, plan.to_json())
            .map_err(|err| format!("{}: {err}", path.display()))?;
    }
    Ok(())
}

/// With a run directory, SIGTERM (a preempted job) stops training at the next step with a
/// checkpoint, and the process exits cleanly.
pub fn stop_on_sigterm(args: &Args) -> Result<Option<kiln::train::StopFlag>, String> {
    // Without a checkpoint to save, SIGTERM keeps its default meaning (end the process).
    if args.run_dir.is_none() || !unsupported(args).is_empty() {
        return Ok(None);
    }
    #[cfg(unix)]
    {
        kiln::train::StopFlag::on_sigterm()
            .map(Some)
            .map_err(|err| format!("installing the SIGTERM handler: {err}"))
    }
    #[cfg(not(unix))]
    {
        Ok(None)
    }
}
