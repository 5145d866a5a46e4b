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
use std::sync::Arc;
use std::time::Instant;

use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use clap::Parser;
use kiln::amp::{AmpStats, MixedPrecision};
use kiln::core::DeviceSpec;
use kiln::data::{Cifar10, ImageSource, SyntheticImages, Transform};
use kiln::ddp::{Compression, DataParallel, DdpConfig, GradientPath, SyncMode, SyncStats};
use kiln::kernels::FusedSgdConfig;
use kiln::planner::Layout;
use kiln::resnet::{ResNet, ResNetConfig, StemKind};
use kiln::train::TrainReport;

mod args;
mod checkpoints;
mod conflicts;
mod doctor;
mod faults;
mod pipeline;
mod planning;
mod replica;
mod selftest;
mod startup;

use replica::{announce, run_mpi, train_replica};

// Counts the heap, so the planner can measure the activations each segment keeps for
// backward on the CPU (one atomic add per allocation).
#[global_allocator]
static ALLOCATOR: kiln::planner::TrackingAllocator = kiln::planner::TrackingAllocator;

use args::{AmpArg, Args, CommArg, CompressionArg, GradientPathArg};
use conflicts::refuse_conflicts;

fn main() -> ExitCode {
    let process_start = Instant::now();
    // Every step frees and allocates the same large buffers: keeping them in the process
    // spares the page faults of taking them back from the system each step.
    if let Err(err) = kiln::core::retain_freed_memory() {
        eprintln!("note: {err}");
    }
    let args = Args::parse();
    // Before any GPU is touched (the selftest's and the doctor's too).
    if let Err(err) = startup::gpu_runtime(&args).apply() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    let passed = match args.command {
        Some(args::Command::Doctor) => Some(doctor::run(&args)),
        Some(args::Command::Selftest) => Some(selftest::run(&args.devices)),
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
            if let Some(hint) = startup::out_of_memory_hint(&text, &placement) {
                eprintln!("{hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// What every replica shares.
struct Setup {
    train: Arc<dyn ImageSource>,
    valid: Arc<dyn ImageSource>,
    transforms: Vec<Transform>,
    valid_transforms: Vec<Transform>,
    model: ResNetConfig,
    /// Each replica's batch, when the plan gives uneven shares.
    planned_batches: Option<Vec<usize>>,
    /// The checkpoint every replica starts from (`--resume`).
    resume_from: Option<std::path::PathBuf>,
    /// Raised by SIGTERM when the run has a directory: stop at the next step, saved.
    stop: Option<kiln::train::StopFlag>,
}

/// What a replica reports back.
struct Outcome {
    rank: usize,
    report: TrainReport,
    sync: SyncStats,
    /// How gradients travelled (data-parallel f32 steps).
    transport: &'static str,
    amp: Option<AmpStats>,
    fingerprint: u64,
}

fn run(args: Args, process_start: Instant) -> Result<(), Box<dyn std::error::Error>> {
    let specs = DeviceSpec::parse_list(&args.devices)?;
    let devices = specs
        .iter()
        .map(DeviceSpec::device)
        .collect::<Result<Vec<_>, _>>()?;

    let (train, valid, transforms): (Arc<dyn ImageSource>, Arc<dyn ImageSource>, Vec<Transform>) =
        match &args.data {
            Some(dir) => {
                let mut transforms = Transform::cifar_augmentation();
                transforms.push(Transform::cifar_normalize());
                (
                    Arc::new(Cifar10::train(dir)?),
                    Arc::new(Cifar10::test(dir)?),
                    transforms,
                )
            }
            None => {
                let train = SyntheticImages::cifar_like(args.synthetic_samples, 10, args.seed);
                let valid = train.split(1_000, 1);
                (Arc::new(train), Arc::new(valid), Vec::new())
            }
        };
    let valid_transforms = transforms
        .iter()
        .filter(|t| matches!(t, Transform::Normalize { .. }))
        .cloned()
        .collect();
    let model =
        ResNetConfig::from_depth(args.model, 10).ok_or("--model must be 18, 34, 50, 101 or 152")?;
    let compression = match args.compression {
        CompressionArg::F32 => Compression::None,
        CompressionArg::F16 => Compression::F16,
        CompressionArg::Bf16 => Compression::Bf16,
    };
    let gradient_path = match args.gradient_path {
        GradientPathArg::Auto => GradientPath::Auto,
        GradientPathArg::Host => GradientPath::Host,
        GradientPathArg::Device => GradientPath::Device,
    };
    refuse_conflicts(&args)?;
    checkpoints::refuse_conflicts(&args)?;
    if args.amp != AmpArg::F32 && specs.iter().all(|s| matches!(s, DeviceSpec::Cpu(_))) {
        eprintln!(
            "note: --amp on the CPU backend saves activation memory, not time (bf16 steps run at about f32 speed, f16 steps about 1.8x slower: Flex's f16 element-wise kernels)"
        );
    }
    let mode = match args.local_sgd {
        Some(period) => SyncMode::LocalSgd { period },
        None => SyncMode::Gradients,
    };
    let mut config = DdpConfig {
        compression,
        mode,
        zero1: args.zero1,
        bucket_cap_bytes: args.bucket_kb << 10,
        first_bucket_bytes: (args.bucket_kb << 10) / 4,
        divergence_check_every: args.check_every,
        gradient_path,
        sync_batch_norm: args.sync_bn,
        threads_per_replica: args.threads,
        precision: MixedPrecision::new(args.amp.precision()),
        max_grad_norm: args.clip_grad_norm,
        ..DdpConfig::default()
    };
    let mut setup = Setup {
        train,
        valid,
        transforms,
        valid_transforms,
        model,
        planned_batches: None,
        resume_from: checkpoints::resume_from(&args)?,
        stop: checkpoints::stop_on_sigterm(&args)?,
    };
    if let Some(stages) = args.pipeline {
        checkpoints::record_config(&args, None)?;
        let shape = pipeline::PipelineRun::by_hand(&args, stages);
        return pipeline::run_restarting(&args, &mut setup, devices, shape);
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
        && let Some(global) = args.global_batch
    {
        // Nothing was left to plan: equal shares of the global batch.
        setup.planned_batches = Some(vec![global / devices.len(); devices.len()]);
    }
    let planning = planning_start.elapsed();
    checkpoints::record_config(&args, plan.as_ref())?;
    let mut predicted_step = None;
    if let Some(plan) = &plan {
        predicted_step = Some(plan.predicted.step_seconds);
        match &plan.layout {
            Layout::Pipeline {
                data_parallel,
                stages,
                schedule,
                micro_batches,
                split,
                ..
            } => {
                let shape = pipeline::PipelineRun {
                    stages: *stages,
                    data_parallel: *data_parallel,
                    micro_batches: *micro_batches,
                    schedule: schedule.parse()?,
                    split: Some(split.clone()),
                    batch_size: plan.global_batch / data_parallel,
                    predicted_step,
                    gradient_checkpointing: plan.gradient_checkpointing,
                };
                return pipeline::run_restarting(&args, &mut setup, devices, shape);
            }
            Layout::DataParallel { batches } => {
                if batches.len() != devices.len() {
                    return Err(format!(
                        "the plan has {} replicas for {} devices",
                        batches.len(),
                        devices.len()
                    )
                    .into());
                }
                setup.planned_batches = Some(batches.clone());
                config.gradient_checkpointing = plan.gradient_checkpointing;
            }
        }
    }

    let outcomes: Vec<Outcome> = match args.comm {
        CommArg::Local => {
            announce(&args, &setup, devices.len(), &args.devices);
            let start = setup.resume_from.clone();
            checkpoints::with_restarts(&args, start, |from| {
                setup.resume_from = from.map(std::path::Path::to_path_buf);
                let run = DataParallel::new(devices.clone())
                    .config(config.clone())
                    .run(|replica| train_replica(replica, &args, &setup))?;
                Ok(run)
            })?
        }
        CommArg::Mpi => run_mpi(&args, &setup, devices, config)?,
    };

    let mut global_images = 0.0;
    let mut slowest_secs: f64 = 0.0;
    for outcome in &outcomes {
        let report = &outcome.report;
        let images: f64 = report
            .epochs
            .iter()
            .map(|e| e.images_per_sec * e.elapsed.as_secs_f64())
            .sum();
        let secs: f64 = report.epochs.iter().map(|e| e.elapsed.as_secs_f64()).sum();
        global_images += images;
        slowest_secs = slowest_secs.max(secs);
        let mut line = format!(
            "replica {}: {:.0} img/s",
            outcome.rank,
            images / secs.max(1e-9)
        );
        if outcome.sync.buckets == 0 {
            line += " | sync: nothing to exchange (one replica)";
        } else {
            let stats = &outcome.sync;
            line += &format!(
                " | sync ({}): {:.1} MB/step in {} buckets, exposed {:.1}% of compute",
                outcome.transport,
                stats.bytes as f64 / stats.steps.max(1) as f64 / 1e6,
                stats.buckets / stats.steps.max(1),
                100.0 * stats.overhead(),
            );
            if stats.communication.is_zero() && outcome.transport.contains("native") {
                // NCCL runs on its own stream; only the wait for it is timed on the host.
                line += ", reduction time not measured on the native path";
            } else {
                line += &format!(
                    ", {:.0}% of communication hidden",
                    100.0 * stats.hidden_fraction()
                );
            }
            if let Some((owned, total)) = stats.optimizer_shard {
                line += &format!(
                    " | ZeRO-1: optimizer state for {owned} of {total} parameters ({:.0}% saved)",
                    100.0 * (1.0 - owned as f64 / total as f64)
                );
            }
        }
        if let Some(amp) = &outcome.amp {
            line += &format!(
                " | AMP {}: loss scale {}, {} of {} steps skipped",
                args.amp.precision(),
                amp.scale,
                amp.skipped,
                amp.steps
            );
        }
        println!("{line}");
        if outcome.rank == 0 {
            println!("final parameters fingerprint: {:016x}", outcome.fingerprint);
        }
    }
    if outcomes.len() > 1 {
        // Replicas run side by side: all images over the slowest replica's time.
        println!(
            "all {} replicas of this process: {:.0} img/s",
            outcomes.len(),
            global_images / slowest_secs.max(1e-9)
        );
    }
    if let Some(stopped) = outcomes.iter().find_map(|o| o.report.stopped_at) {
        println!(
            "stopped at step {} by SIGTERM; continue with --resume latest",
            stopped.step
        );
    }
    // Each replica's batch: the plan's shares, else --batch-size (MPI: ranks over processes).
    let batches = setup.planned_batches.clone().unwrap_or_else(|| {
        vec![args.batch_size; outcomes.iter().map(|o| o.rank + 1).max().unwrap_or(0)]
    });
    // The median step after the first (which warms up), of the slowest replica: steps in
    // lockstep, validation and start-up not counted, as the prediction does not.
    let median_step = outcomes
        .iter()
        .map(|outcome| {
            startup::median_step_seconds(&outcome.report, batches[outcome.rank] * args.accumulation)
        })
        .fold(0.0, f64::max);
    if let Some(line) = startup::startup_line(process_start, planning, &outcomes, median_step) {
        println!("{line}");
    }
    if let (Some(plan), Some(predicted)) = (&plan, predicted_step)
        && let Layout::DataParallel { .. } = &plan.layout
    {
        let measured = median_step;
        if measured.is_finite() && measured > 0.0 {
            println!(
                "planner: predicted step {:.1} ms, measured {:.1} ms ({:+.0}%)",
                predicted * 1e3,
                measured * 1e3,
                100.0 * (measured / predicted - 1.0)
            );
        } else {
            println!(
                "planner: predicted step {:.1} ms, nothing measured (the first step warms up and is not counted: train 2 steps or more to compare)",
                predicted * 1e3
            );
        }
    }
    Ok(())
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
