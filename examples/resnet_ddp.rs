//! Trains a ResNet with one data-parallel replica per device, on CIFAR-10 or a synthetic
//! CIFAR-shaped task.
//!
//! ```text
//! cargo run --release --example resnet_ddp                       # 2 CPU replicas, synthetic data
//! cargo run --release --example resnet_ddp -- --devices cpu:0    # one replica
//! cargo run --release --example resnet_ddp -- --data cifar-10-batches-bin --epochs 10 --width 64
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use burn::optim::SgdConfig;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use clap::Parser;
use kiln::core::{DeviceSpec, init_module};
use kiln::data::{Cifar10, DataLoader, ImageSource, SyntheticImages, Transform};
use kiln::ddp::{Compression, DataParallel, DdpConfig, SyncMode};
use kiln::resnet::{ResNetConfig, StemKind};
use kiln::train::{LrSchedule, Trainer};

/// Train a ResNet with kiln.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// ResNet depth: 18, 34, 50, 101 or 152.
    #[arg(long, default_value_t = 18)]
    model: usize,
    /// Base width (64 is the paper's ResNet; smaller trains faster).
    #[arg(long, default_value_t = 8)]
    width: usize,
    /// Batch size per replica.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Epochs to train.
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// Train for exactly this many steps instead of whole epochs.
    #[arg(long)]
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
    #[arg(long, default_value_t = 1)]
    accumulation: usize,
    /// Gradient all-reduce element type: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    compression: String,
    /// Local SGD: average parameters every N steps instead of all-reducing gradients.
    #[arg(long)]
    local_sgd: Option<usize>,
    /// All-reduce after the whole backward instead of overlapping it segment by segment.
    #[arg(long)]
    no_overlap: bool,
    /// ZeRO-1: shard optimizer state over replicas.
    #[arg(long)]
    zero1: bool,
    /// CIFAR-10 binary directory (`cifar-10-batches-bin`); synthetic data when absent.
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// Synthetic training samples (without --data).
    #[arg(long, default_value_t = 6_400)]
    synthetic_samples: usize,
    /// Loader worker threads.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Batches each worker prepares ahead.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
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

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let specs = DeviceSpec::parse_list(&args.devices)?;
    let devices = specs
        .iter()
        .map(DeviceSpec::device)
        .collect::<Result<Vec<_>, _>>()?;
    let world = devices.len();

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
    let valid_transforms: Vec<Transform> = transforms
        .iter()
        .filter(|t| matches!(t, Transform::Normalize { .. }))
        .cloned()
        .collect();
    let config =
        ResNetConfig::from_depth(args.model, 10).ok_or("--model must be 18, 34, 50, 101 or 152")?;
    let compression = match args.compression.as_str() {
        "f32" => Compression::None,
        "f16" => Compression::F16,
        "bf16" => Compression::Bf16,
        other => return Err(format!("--compression must be f32, f16 or bf16, not {other}").into()),
    };
    let mode = match args.local_sgd {
        Some(period) => SyncMode::LocalSgd { period },
        None => SyncMode::Gradients,
    };
    println!(
        "kiln: resnet{} width {} | {world} replica(s) on {} | {} training / {} validation images | batch {} x {world} x {} accumulation",
        args.model,
        args.width,
        args.devices,
        train.len(),
        valid.len(),
        args.batch_size,
        args.accumulation
    );

    let results = DataParallel::new(devices)
        .config(DdpConfig {
            compression,
            mode,
            zero1: args.zero1,
            ..DdpConfig::default()
        })
        .run(|replica| {
            let device = replica.train_device();
            let primary = replica.is_primary();
            let model = init_module(&device, args.seed, || {
                config
                    .clone()
                    .with_stem(StemKind::Cifar)
                    .with_base_width(args.width)
                    .init(&device)
            });
            let model = replica.broadcast_module(model)?;
            let train_loader = DataLoader::builder(Arc::clone(&train))
                .batch_size(args.batch_size)
                .num_workers(args.workers)
                .prefetch(args.prefetch)
                .shuffle(args.seed)
                .drop_last(true)
                .shard(replica.rank(), replica.world_size())
                .transforms(transforms.clone())
                .device(device.clone())
                .build();
            let steps_per_epoch = train_loader.num_batches() / args.accumulation;
            let total_steps = args.steps.unwrap_or(args.epochs * steps_per_epoch);
            let schedule = LrSchedule::constant(args.lr)
                .warmup((total_steps / 10).max(1))
                .cosine(total_steps, 0.0);
            let optimizer = SgdConfig::new()
                .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
                .with_weight_decay(Some(WeightDecayConfig::new(5e-4)))
                .init();
            let step = if args.no_overlap {
                replica.gradient_step()
            } else {
                replica.overlapped_step()
            };
            let stats = step.stats();
            let mut builder = Trainer::builder(model, optimizer)
                .gradient_step(step)
                .schedule(schedule)
                .train_loader(train_loader)
                .accumulation_steps(args.accumulation)
                .progress(primary && !args.quiet)
                .log_epochs(primary);
            if primary {
                let valid_loader = DataLoader::builder(Arc::clone(&valid))
                    .batch_size(256)
                    .num_workers(args.workers)
                    .transforms(valid_transforms.clone())
                    .device(replica.device().clone())
                    .build();
                builder = builder.valid_loader(valid_loader);
            }
            builder = match args.steps {
                Some(steps) => builder.max_steps(steps),
                None => builder.epochs(args.epochs),
            };
            let (_model, report) = builder.build()?.fit()?;
            let stats = *stats.lock().unwrap_or_else(|p| p.into_inner());
            Ok((report, stats))
        })?;

    for (rank, (report, stats)) in results.iter().enumerate() {
        let images: f64 = report
            .epochs
            .iter()
            .map(|e| e.images_per_sec * e.elapsed.as_secs_f64())
            .sum();
        let secs: f64 = report.epochs.iter().map(|e| e.elapsed.as_secs_f64()).sum();
        println!(
            "replica {rank}: {:.0} img/s | sync: {:.1} MB/step in {} buckets, exposed {:.1}% of compute, {:.0}% of communication hidden",
            images / secs.max(1e-9),
            stats.bytes as f64 / stats.steps.max(1) as f64 / 1e6,
            stats.buckets / stats.steps.max(1),
            100.0 * stats.overhead(),
            100.0 * stats.hidden_fraction()
        );
        if let Some((owned, total)) = stats.optimizer_shard {
            println!(
                "replica {rank}: ZeRO-1 optimizer state for {owned} of {total} parameters ({:.0}% saved)",
                100.0 * (1.0 - owned as f64 / total as f64)
            );
        }
    }
    Ok(())
}
