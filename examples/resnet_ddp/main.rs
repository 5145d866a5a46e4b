//! Trains a ResNet with one data-parallel replica per device, on CIFAR-10 or a synthetic
//! CIFAR-shaped task.
//!
//! ```text
//! cargo run --release --example resnet_ddp                       # 2 CPU replicas, synthetic data
//! cargo run --release --example resnet_ddp -- --devices cpu:0    # one replica
//! cargo run --release --example resnet_ddp -- --data cifar-10-batches-bin --epochs 10 --width 64
//! cargo build --release --features mpi --example resnet_ddp
//! mpirun -np 2 target/release/examples/resnet_ddp --comm mpi --devices cpu
//! ```

use std::process::ExitCode;
use std::time::Instant;

use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use clap::Parser;
use kiln::core::DeviceSpec;
use kiln::data::ImageTask;
use kiln::ddp::{DataParallel, DdpConfig};
use kiln::kernels::FusedSgdConfig;
use kiln::pipeline::PipelineShape;
use kiln::planner::Layout;
use kiln::resnet::{ResNet, ResNetConfig, StemKind};
use kiln::train::{LrScaling, LrSchedule, StartupCost};

mod args;
mod checkpoints;
mod conflicts;
mod pipeline;
mod planning;
mod replica;

use replica::{announce, run_mpi, train_replica};

// Counts the heap, so the planner can measure the activations each segment keeps for
// backward on the CPU (one atomic add per allocation).
#[global_allocator]
static ALLOCATOR: kiln::planner::TrackingAllocator = kiln::planner::TrackingAllocator;

use args::{Args, CommArg};
use conflicts::refuse_conflicts;

fn main() -> ExitCode {
    let process_start = Instant::now();
    // Every step frees and allocates the same large buffers: keeping them in the process
    // spares the page faults of taking them back from the system each step.
    if let Err(err) = kiln::core::retain_freed_memory() {
        eprintln!("note: {err}");
    }
    let mut args = Args::parse();
    // A relaunched job (the `launch` subcommand's) does not inject its fault again.
    if kiln::checkpoint::launch_number() > 0 {
        args.inject_fault = None;
    }
    // Before any GPU is touched (the selftest's and the doctor's too).
    if let Err(err) = args.gpu.apply() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    let passed =
        (args.command.as_ref()).map(|task| task.run(&args.devices, args.comm == CommArg::Mpi));
    if let Some(passed) = passed {
        return if passed {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let placement = format!(
        "--devices {}, batch {} per replica",
        args.devices, args.batch_size
    );
    match run(args, process_start) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let text = err.to_string();
            eprintln!("error: {text}");
            if let Some(hint) = kiln::train::out_of_memory_hint(&text, &placement) {
                eprintln!("{hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// What every replica shares.
struct Setup {
    /// CIFAR-10 from `--data` (augmented, normalised), else a synthetic CIFAR-shaped task.
    task: ImageTask,
    model: ResNetConfig,
    /// Each replica's batch, when the plan gives uneven shares.
    planned_batches: Option<Vec<usize>>,
    /// The checkpoint every replica starts from (`--resume`).
    resume_from: Option<std::path::PathBuf>,
    /// Raised by SIGTERM when the run has a directory: stop at the next step, saved.
    stop: Option<kiln::train::StopFlag>,
}

fn run(args: Args, process_start: Instant) -> Result<(), Box<dyn std::error::Error>> {
    let named = DeviceSpec::open_list(&args.devices)?;
    let specs: Vec<DeviceSpec> = named.iter().map(|(_, spec, _)| *spec).collect();
    let devices: Vec<_> = named.iter().map(|(_, _, device)| device.clone()).collect();
    let task = match &args.data {
        Some(dir) => ImageTask::cifar10(dir)?,
        None => ImageTask::synthetic_cifar(args.synthetic_samples, 10, args.seed),
    };
    let model =
        ResNetConfig::from_depth(args.model, 10).ok_or("--model must be 18, 34, 50, 101 or 152")?;
    let mut config = args.ddp.config(DdpConfig::default().with_steps(&args.step));
    refuse_conflicts(&args)?;
    checkpoints::refuse_conflicts(&args)?;
    if let Some(note) = args.step.note_for(&specs) {
        eprintln!("{note}");
    }
    let mut setup = Setup {
        task,
        model,
        planned_batches: None,
        resume_from: args.run.resume_from()?,
        // Without a checkpoint to save, SIGTERM keeps its meaning (end the process).
        stop: match checkpoints::saveable(&args) {
            true => args.run.stop_on_sigterm()?,
            false => None,
        },
    };
    if let Some(shape) = PipelineShape::by_hand(&args.pipeline) {
        checkpoints::record_config(&args, None)?;
        let batch = args.batch_size;
        return pipeline::run_restarting(&args, &mut setup, devices, (shape, batch));
    }
    // MPI runs are data parallel over every process's devices (planned per process, they
    // would be planned apart); the in-process run asks the planner.
    let planning_start = Instant::now();
    let plan = match args.comm {
        CommArg::Local => planning::choose(&args, &setup, &named)?,
        CommArg::Mpi => None,
    };
    if plan.is_none()
        && args.comm == CommArg::Local
        && let Some(global) = args.planner.global_batch
    {
        // Nothing was left to plan: equal shares of the global batch.
        setup.planned_batches = Some(vec![global / devices.len(); devices.len()]);
    }
    let planning = planning_start.elapsed();
    checkpoints::record_config(&args, plan.as_ref())?;
    if let Some(plan) = &plan
        && let Some(shape) = follow_plan(plan, &mut setup, &mut config, devices.len())?
    {
        return pipeline::run_restarting(&args, &mut setup, devices, shape);
    }

    let outcomes = match args.comm {
        CommArg::Local => {
            announce(&args, &setup, devices.len(), &args.devices);
            let start = setup.resume_from.clone();
            args.run
                .with_restarts(start, |from| -> Result<_, Box<dyn std::error::Error>> {
                    setup.resume_from = from.map(std::path::Path::to_path_buf);
                    let run = DataParallel::new(devices.clone())
                        .config(config.clone())
                        .run(|replica| train_replica(replica, &args, &setup))?;
                    Ok(run)
                })?
        }
        CommArg::Mpi => run_mpi(&args, &setup, devices, config)?,
    };
    print!("{}", kiln::ddp::outcome_lines(&outcomes));
    // Each replica's batch: the plan's shares, else --batch-size (MPI: ranks over processes).
    let batch = |rank| {
        setup
            .planned_batches
            .as_ref()
            .map_or(args.batch_size, |b| b[rank])
    };
    let steady =
        kiln::ddp::steady_step_seconds(&outcomes, |rank| batch(rank) * args.step.accumulation);
    let first_steps = outcomes.iter().filter_map(|o| o.report.first_step);
    let steady_step = steady.map(std::time::Duration::from_secs_f64);
    if let Some(cost) = StartupCost::measure(process_start, planning, first_steps, steady_step) {
        println!("{cost}");
    }
    if let Some(plan) = plan.filter(|plan| matches!(plan.layout, Layout::DataParallel { .. })) {
        let predicted = plan.predicted.step_seconds;
        println!("{}", kiln::planner::prediction_line(predicted, steady));
    }
    Ok(())
}

/// Takes the planner's choice: a pipeline's shape and batch to run, or (`None`) the
/// data-parallel replicas' batches and checkpointing written into `setup` and `config`.
fn follow_plan(
    plan: &kiln::planner::Plan,
    setup: &mut Setup,
    config: &mut DdpConfig,
    devices: usize,
) -> Result<Option<(PipelineShape, usize)>, Box<dyn std::error::Error>> {
    if let Some(shape) = PipelineShape::planned(plan)? {
        let batch = plan.global_batch / shape.config.data_parallel;
        return Ok(Some((shape, batch)));
    }
    let Layout::DataParallel { batches } = &plan.layout else {
        unreachable!("a plan that is not a pipeline is data parallel")
    };
    if batches.len() != devices {
        let replicas = batches.len();
        return Err(format!("the plan has {replicas} replicas for {devices} devices").into());
    }
    setup.planned_batches = Some(batches.clone());
    config.gradient_checkpointing = plan.gradient_checkpointing;
    Ok(None)
}

/// The learning rate over `steps` steps of `step_samples` samples (`--lr`, `--lr-scaling`,
/// said when `speaks`): a warm-up over the first tenth, then a cosine decay to zero.
fn lr_schedule(args: &Args, steps: usize, step_samples: usize, speaks: bool) -> LrSchedule {
    if speaks && args.lr_scaling != LrScaling::None {
        println!("{}", args.lr_scaling.describe(args.lr, step_samples));
    }
    LrSchedule::constant(args.lr_scaling.lr(args.lr, step_samples))
        .warmup((steps / 10).max(1))
        .cosine(steps, 0.0)
}

/// The model every run of the example trains (and the planner profiles): `--seed`'s, built on
/// the CPU and forked to `device`, so the same on every device kind (pipeline stages on
/// different kinds start from one model).
fn build_model(args: &Args, setup: &Setup, device: &burn::tensor::Device) -> ResNet {
    kiln::core::init_on_host(device, args.seed, |device| {
        setup
            .model
            .clone()
            .with_stem(StemKind::Cifar)
            .with_base_width(args.width)
            .init(device)
    })
}

/// The optimizer every run of the example trains with (and the planner profiles):
/// SGD, momentum 0.9, weight decay 5e-4 (Burn's `Sgd` arithmetic, in kiln's one-pass kernel).
fn optimizer() -> burn::optim::ModuleOptimizer {
    FusedSgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .with_weight_decay(Some(WeightDecayConfig::new(5e-4)))
        .init()
}
