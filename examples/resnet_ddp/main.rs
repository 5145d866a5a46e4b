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

mod args;
mod checkpoints;
mod conflicts;
mod pipeline;
mod planning;
mod replica;
mod report;

use replica::{announce, run_mpi, train_replica};

// Counts the heap, so the planner can measure the activations each segment keeps for
// backward on the CPU (one atomic add per allocation).
#[global_allocator]
static ALLOCATOR: kiln::planner::TrackingAllocator = kiln::planner::TrackingAllocator;

use args::{Args, CommArg};
use conflicts::refuse_conflicts;
use kiln::amp::Precision;

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
    let passed = match &args.command {
        Some(args::Command::Doctor) => {
            let checkup = kiln::doctor::Doctor::new(&args.devices)
                .require_mpi(args.comm == CommArg::Mpi)
                .check();
            print!("{checkup}");
            Some(checkup.passed())
        }
        Some(args::Command::Selftest) => {
            match kiln::ddp::SelfTest::on(&args.devices).and_then(|test| test.run()) {
                Ok(report) => {
                    println!("{report}");
                    Some(report.passed())
                }
                Err(err) => {
                    println!("selftest: {err}");
                    Some(false)
                }
            }
        }
        Some(args::Command::Launch(launch)) => {
            let outcome = launch.run();
            match &outcome {
                Ok(done) => eprintln!(
                    "launch: the job succeeded after {} restart(s)",
                    done.restarts
                ),
                Err(err) => eprintln!("error: {err}"),
            }
            Some(outcome.is_ok())
        }
        None => None,
    };
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
    let specs = DeviceSpec::parse_list(&args.devices)?;
    let devices = specs
        .iter()
        .map(DeviceSpec::device)
        .collect::<Result<Vec<_>, _>>()?;
    let task = match &args.data {
        Some(dir) => ImageTask::cifar10(dir)?,
        None => ImageTask::synthetic_cifar(args.synthetic_samples, 10, args.seed),
    };
    let model =
        ResNetConfig::from_depth(args.model, 10).ok_or("--model must be 18, 34, 50, 101 or 152")?;
    let mut config = ddp_config(&args);
    refuse_conflicts(&args)?;
    checkpoints::refuse_conflicts(&args)?;
    if args.step.amp != Precision::F32 && specs.iter().all(|s| matches!(s, DeviceSpec::Cpu(_))) {
        eprintln!(
            "note: --amp on the CPU backend saves activation memory, not time (bf16 steps run at about f32 speed, f16 steps about 1.8x slower: Flex's f16 element-wise kernels)"
        );
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
        CommArg::Local => planning::choose(&args, &setup, &specs, &devices)?,
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
    report::print_timing(
        &args,
        &setup,
        &outcomes,
        process_start,
        planning,
        plan.as_ref(),
    );
    Ok(())
}

/// The data-parallel options the command line asks for.
fn ddp_config(args: &Args) -> DdpConfig {
    args.ddp.config(DdpConfig::default().with_steps(&args.step))
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
