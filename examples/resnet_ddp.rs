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

use burn::optim::SgdConfig;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use clap::{Parser, ValueEnum};
use kiln::amp::{AmpStats, AmpStep, Precision};
use kiln::core::{DeviceSpec, fingerprint, init_module};
use kiln::data::{Cifar10, DataLoader, ImageSource, SyntheticImages, Transform};
use kiln::ddp::{Compression, DataParallel, DdpConfig, GradientPath, Replica, SyncMode, SyncStats};
use kiln::resnet::{ResNet, ResNetConfig, StemKind};
use kiln::train::{GradientStep, LrSchedule, TrainError, TrainReport, Trainer};

/// Counts that must be at least one (batch sizes, periods, widths, ...).
fn positive() -> impl clap::builder::TypedValueParser<Value = usize> {
    |text: &str| match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(count) => Ok(count),
        Err(err) => Err(format!("not a count: {err}")),
    }
}

/// Gradient element type on the wire.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CompressionArg {
    F32,
    F16,
    Bf16,
}

/// Where gradients wait for their all-reduce.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum GradientPathArg {
    Auto,
    Host,
    Device,
}

/// Compute precision.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum AmpArg {
    F32,
    F16,
    Bf16,
}

/// How replicas communicate.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CommArg {
    Local,
    Mpi,
}

/// Train a ResNet with kiln.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// ResNet depth: 18, 34, 50, 101 or 152.
    #[arg(long, default_value_t = 18)]
    model: usize,
    /// Base width (64 is the paper's ResNet; smaller trains faster).
    #[arg(long, default_value_t = 8, value_parser = positive())]
    width: usize,
    /// Batch size per replica.
    #[arg(long, default_value_t = 32, value_parser = positive())]
    batch_size: usize,
    /// Epochs to train.
    #[arg(long, default_value_t = 2, value_parser = positive())]
    epochs: usize,
    /// Train for exactly this many steps instead of whole epochs.
    #[arg(long, value_parser = positive())]
    steps: Option<usize>,
    /// Peak learning rate (after warm-up; cosine decay to zero).
    #[arg(long, default_value_t = 0.1)]
    lr: f64,
    /// Seed for initialisation, shuffling and augmentation.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Devices, one replica each, comma-separated: cpu, cpu:N, cuda:N, wgpu.
    #[arg(long, default_value = "cpu:0,cpu:1")]
    devices: String,
    /// Micro-batches accumulated per optimizer step (one all-reduce per step).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    accumulation: usize,
    /// Gradient all-reduce element type.
    #[arg(long, value_enum, default_value_t = CompressionArg::F32)]
    compression: CompressionArg,
    /// Local SGD: average parameters every N steps instead of all-reducing gradients.
    #[arg(long, value_parser = positive())]
    local_sgd: Option<usize>,
    /// All-reduce after the whole backward instead of overlapping it segment by segment.
    #[arg(long)]
    no_overlap: bool,
    /// Gradient bucket cap in KiB (the first bucket is capped at a quarter of it). Smaller
    /// buckets start communicating earlier during backward.
    #[arg(long, default_value_t = 25 * 1024, value_parser = positive())]
    bucket_kb: usize,
    /// Compare parameter fingerprints across replicas every N steps (0 = never); a mismatch
    /// stops training with an error naming the first differing parameter.
    #[arg(long, default_value_t = 0)]
    check_every: usize,
    /// Size each replica's batch by its measured throughput (a few probe steps), keeping
    /// --batch-size x replicas as the global batch.
    #[arg(long)]
    balance: bool,
    /// Where gradients wait for their all-reduce: `auto` (host buffer on CPU, device buckets
    /// on accelerators), `host`, or `device` (Burn's native NCCL all-reduce when every
    /// replica has its own CUDA device, else one host copy per bucket).
    #[arg(long, value_enum, default_value_t = GradientPathArg::Auto)]
    gradient_path: GradientPathArg,
    /// Synchronised batch norm: normalise with the statistics of every replica's batch
    /// (exact backward; backward replays each residual block's forward once).
    #[arg(long)]
    sync_bn: bool,
    /// ZeRO-1: shard optimizer state over replicas.
    #[arg(long)]
    zero1: bool,
    /// Compute precision: f32, or mixed precision with f16 (loss-scaled) or bf16 compute and
    /// f32 master weights. On the CPU backend (Flex) this saves activation memory but not
    /// time: bf16 matmuls and convolutions compute through f32 and f16 kernels are slower than
    /// f32's, so a CPU step is slower with --amp (see the README's limitations).
    #[arg(long, value_enum, default_value_t = AmpArg::F32)]
    amp: AmpArg,
    /// How replicas communicate: `local` (threads of this process, one per --devices entry)
    /// or `mpi` (under mpirun: every process runs one replica per --devices entry; needs
    /// `--features mpi`).
    #[arg(long, value_enum, default_value_t = CommArg::Local)]
    comm: CommArg,
    /// CIFAR-10 binary directory (`cifar-10-batches-bin`); synthetic data when absent.
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// Synthetic training samples (without --data).
    #[arg(long, default_value_t = 6_400, value_parser = positive())]
    synthetic_samples: usize,
    /// Loader worker threads.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Batches each worker prepares ahead.
    #[arg(long, default_value_t = 2, value_parser = positive())]
    prefetch: usize,
    /// Compute threads per replica (each replica runs Burn's CPU kernels in its own pool).
    /// Default: the machine's cores divided among this process's replicas.
    #[arg(long, value_parser = positive())]
    threads: Option<usize>,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
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
}

/// What a replica reports back.
struct Outcome {
    rank: usize,
    report: TrainReport,
    sync: Option<SyncStats>,
    /// How gradients travelled (data-parallel f32 steps).
    transport: Option<&'static str>,
    amp: Option<AmpStats>,
    fingerprint: u64,
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
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
    if args.amp != AmpArg::F32 && specs.iter().all(|s| matches!(s, DeviceSpec::Cpu(_))) {
        eprintln!(
            "note: --amp on the CPU backend saves activation memory, not time (Flex computes bf16 through f32; its f16 kernels are slower than f32)"
        );
    }
    let mode = match args.local_sgd {
        Some(period) => SyncMode::LocalSgd { period },
        None => SyncMode::Gradients,
    };
    let config = DdpConfig {
        compression,
        mode,
        zero1: args.zero1,
        bucket_cap_bytes: args.bucket_kb << 10,
        first_bucket_bytes: (args.bucket_kb << 10) / 4,
        divergence_check_every: args.check_every,
        gradient_path,
        sync_batch_norm: args.sync_bn,
        threads_per_replica: args.threads,
        ..DdpConfig::default()
    };
    let setup = Setup {
        train,
        valid,
        transforms,
        valid_transforms,
        model,
    };

    let outcomes: Vec<Outcome> = match args.comm {
        CommArg::Local => {
            announce(&args, &setup, devices.len(), &args.devices);
            DataParallel::new(devices)
                .config(config)
                .run(|replica| train_replica(replica, &args, &setup))?
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
        if let Some(stats) = &outcome.sync {
            line += &format!(
                " | sync ({}): {:.1} MB/step in {} buckets, exposed {:.1}% of compute",
                outcome.transport.unwrap_or("host buffer"),
                stats.bytes as f64 / stats.steps.max(1) as f64 / 1e6,
                stats.buckets / stats.steps.max(1),
                100.0 * stats.overhead(),
            );
            if stats.communication.is_zero() && outcome.transport == Some("native") {
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
                " | AMP {:?}: loss scale {}, {} of {} steps skipped",
                args.amp, amp.scale, amp.skipped, amp.steps
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
    Ok(())
}

/// Refuses option combinations that would otherwise be silently ignored.
fn refuse_conflicts(args: &Args) -> Result<(), String> {
    if args.amp != AmpArg::F32 {
        // The mixed-precision step all-reduces whole gradients itself; these options belong
        // to the f32 data-parallel step.
        let ignored = [
            (args.sync_bn, "--sync-bn"),
            (args.zero1, "--zero1"),
            (args.local_sgd.is_some(), "--local-sgd"),
            (args.compression != CompressionArg::F32, "--compression"),
            (args.no_overlap, "--no-overlap"),
            (args.bucket_kb != 25 * 1024, "--bucket-kb"),
            (
                args.gradient_path != GradientPathArg::Auto,
                "--gradient-path",
            ),
            (args.check_every != 0, "--check-every"),
        ];
        let named: Vec<&str> = ignored
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        if !named.is_empty() {
            return Err(format!(
                "--amp {:?} cannot be combined with {}: mixed precision has its own gradient all-reduce, which does not offer them yet",
                args.amp,
                named.join(", ")
            )
            .to_lowercase());
        }
    }
    if args.local_sgd.is_some() && args.zero1 {
        return Err(
            "--local-sgd and --zero1 conflict: ZeRO-1 shards the optimizer of a synchronous step"
                .into(),
        );
    }
    if args.local_sgd.is_some() && args.sync_bn {
        return Err(
            "--local-sgd and --sync-bn conflict: synchronised batch norm needs replicas in step"
                .into(),
        );
    }
    if args.balance && args.comm == CommArg::Mpi {
        return Err("--balance works with --comm local only".into());
    }
    Ok(())
}

fn announce(args: &Args, setup: &Setup, world: usize, placement: &str) {
    println!(
        "kiln: resnet{} width {} | {world} replica(s) on {placement} | {} training / {} validation images | batch {} x {world} x {} accumulation",
        args.model,
        args.width,
        setup.train.len(),
        setup.valid.len(),
        args.batch_size,
        args.accumulation
    );
}

/// Under `mpirun`: every process trains one replica per entry of `--devices` (processes ×
/// local devices), MPI between processes and shared memory within each.
#[cfg(feature = "mpi")]
fn run_mpi(
    args: &Args,
    setup: &Setup,
    devices: Vec<burn::tensor::Device>,
    config: DdpConfig,
) -> Result<Vec<Outcome>, Box<dyn std::error::Error>> {
    let mpi = kiln::comm::MpiCommunicator::world(config.timeout)?;
    let (process, processes) = (mpi.rank(), mpi.world_size());
    let local = devices.len();
    if process == 0 {
        let placement = format!(
            "{processes} MPI process(es) x {local} local device(s) ({})",
            args.devices
        );
        announce(args, setup, processes * local, &placement);
    }
    Ok(DataParallel::new(devices)
        .config(config)
        .run_mpi(mpi, |replica| train_replica(replica, args, setup))?)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(
    _: &Args,
    _: &Setup,
    _: Vec<burn::tensor::Device>,
    _: DdpConfig,
) -> Result<Vec<Outcome>, Box<dyn std::error::Error>> {
    Err("--comm mpi needs the example built with `--features mpi`".into())
}

fn train_replica(replica: Replica, args: &Args, setup: &Setup) -> Result<Outcome, TrainError> {
    let device = replica.train_device();
    let primary = replica.is_primary();
    let model = init_module(&device, args.seed, || {
        setup
            .model
            .clone()
            .with_stem(StemKind::Cifar)
            .with_base_width(args.width)
            .init(&device)
    });
    let model = replica.broadcast_module(model)?;
    let (batch_size, weights) = if args.balance {
        let split = replica.split_batch(
            measure_throughput(&model, setup, args, &device)?,
            args.batch_size * replica.world_size(),
        )?;
        if primary {
            println!(
                "balanced batches {:?} from measured {:?} img/s",
                split.batches, split.throughput
            );
        }
        (split.batches[replica.rank()], Some(split.weights()))
    } else {
        (args.batch_size, None)
    };
    let mut train_loader = DataLoader::builder(Arc::clone(&setup.train))
        .batch_size(batch_size)
        .num_workers(args.workers)
        .prefetch(args.prefetch)
        .shuffle(args.seed)
        .drop_last(true)
        .shard(replica.rank(), replica.world_size())
        .transforms(setup.transforms.clone())
        .device(device.clone());
    if let Some(weights) = weights {
        train_loader = train_loader.shard_weights(weights);
    }
    let train_loader = train_loader.build();
    let steps_per_epoch = train_loader.num_batches() / args.accumulation;
    let total_steps = args.steps.unwrap_or(args.epochs * steps_per_epoch);
    let schedule = LrSchedule::constant(args.lr)
        .warmup((total_steps / 10).max(1))
        .cosine(total_steps, 0.0);
    let optimizer = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .with_weight_decay(Some(WeightDecayConfig::new(5e-4)))
        .init();
    let precision = match args.amp {
        AmpArg::F32 => Precision::F32,
        AmpArg::F16 => Precision::F16,
        AmpArg::Bf16 => Precision::Bf16,
    };
    let mut transport = None;
    let (step, sync, amp): (Box<dyn GradientStep<ResNet>>, _, _) = if precision == Precision::F32 {
        let step = if args.no_overlap {
            replica.non_overlapped_step()
        } else {
            replica.overlapped_step()
        };
        let stats = step.stats();
        transport = Some(step.transport());
        (Box::new(step), Some(stats), None)
    } else {
        let step = AmpStep::new(precision).data_parallel(replica.comm());
        let stats = step.stats();
        (Box::new(step), None, Some(stats))
    };
    let mut builder = Trainer::builder(model, optimizer)
        .gradient_step(step)
        .schedule(schedule)
        .train_loader(train_loader)
        .accumulation_steps(args.accumulation)
        .progress(primary && !args.quiet)
        .log_epochs(primary);
    if primary {
        let valid_loader = DataLoader::builder(Arc::clone(&setup.valid))
            .batch_size(256)
            .num_workers(args.workers)
            .transforms(setup.valid_transforms.clone())
            .device(replica.device().clone())
            .build();
        builder = builder.valid_loader(valid_loader);
    }
    builder = match args.steps {
        Some(steps) => builder.max_steps(steps),
        None => builder.epochs(args.epochs),
    };
    let (model, report) = builder.build()?.fit()?;
    let sync = sync.map(|s| *s.lock().unwrap_or_else(|p| p.into_inner()));
    let amp = amp.map(|s| *s.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(Outcome {
        rank: replica.rank(),
        report,
        sync,
        transport,
        amp,
        fingerprint: fingerprint(&model),
    })
}

/// This replica's training throughput (images/s) over a few probe steps on its device.
fn measure_throughput(
    model: &ResNet,
    setup: &Setup,
    args: &Args,
    device: &burn::tensor::Device,
) -> Result<f64, TrainError> {
    let mut probe = DataLoader::builder(Arc::clone(&setup.train))
        .batch_size(args.batch_size)
        .device(device.clone())
        .build();
    let batches: Vec<_> = probe.epoch(0).take(4).collect::<Result<_, _>>()?;
    let mut timed = 0.0;
    let mut images = 0;
    for (i, batch) in batches.into_iter().enumerate() {
        let size = batch.indices.len();
        let start = std::time::Instant::now();
        let _ = kiln::train::forward_backward(model, batch);
        if i > 0 {
            timed += start.elapsed().as_secs_f64();
            images += size;
        }
    }
    Ok(images as f64 / timed.max(1e-9))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Args, refuse_conflicts};

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("resnet_ddp").chain(extra.iter().copied()))
    }

    #[test]
    fn out_of_range_values_are_refused_when_parsing() {
        for bad in [
            ["--batch-size", "0"],
            ["--accumulation", "0"],
            ["--prefetch", "0"],
            ["--width", "0"],
            ["--local-sgd", "0"],
            ["--steps", "0"],
            ["--epochs", "0"],
            ["--bucket-kb", "0"],
            ["--threads", "0"],
            ["--amp", "fp8"],
            ["--compression", "int8"],
            ["--gradient-path", "disk"],
            ["--comm", "tcp"],
        ] {
            let error = parse(&bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert!(
                error.to_string().contains(bad[0]),
                "{bad:?}: the message names the option: {error}"
            );
        }
        assert!(parse(&["--threads", "2", "--local-sgd", "3"]).is_ok());
    }

    #[test]
    fn options_that_would_be_ignored_are_refused_with_the_reason() {
        let refused = |extra: &[&str], names: &[&str]| {
            let args = parse(extra).expect("parses");
            let message = refuse_conflicts(&args).expect_err("refused");
            for name in names {
                assert!(message.contains(name), "{extra:?}: {message}");
            }
        };
        refused(&["--amp", "bf16", "--zero1"], &["--amp", "--zero1"]);
        refused(
            &["--amp", "f16", "--local-sgd", "2", "--bucket-kb", "64"],
            &["--local-sgd", "--bucket-kb"],
        );
        refused(
            &["--amp", "bf16", "--compression", "f16"],
            &["--compression"],
        );
        refused(
            &["--amp", "bf16", "--gradient-path", "host"],
            &["--gradient-path"],
        );
        refused(
            &["--amp", "bf16", "--no-overlap", "--check-every", "3"],
            &["--no-overlap", "--check-every"],
        );
        refused(&["--amp", "bf16", "--sync-bn"], &["--sync-bn"]);
        refused(
            &["--local-sgd", "2", "--zero1"],
            &["--local-sgd", "--zero1"],
        );
        refused(
            &["--local-sgd", "2", "--sync-bn"],
            &["--local-sgd", "--sync-bn"],
        );
        refused(&["--balance", "--comm", "mpi"], &["--balance"]);
        for fine in [
            &["--amp", "bf16"][..],
            &["--zero1", "--compression", "bf16", "--bucket-kb", "64"],
            &["--local-sgd", "4", "--accumulation", "2"],
            &[
                "--sync-bn",
                "--gradient-path",
                "device",
                "--check-every",
                "2",
            ],
        ] {
            let args = parse(fine).expect("parses");
            assert!(
                refuse_conflicts(&args).is_ok(),
                "{fine:?} is a valid combination"
            );
        }
    }
}
