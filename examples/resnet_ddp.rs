//! Trains a ResNet on CIFAR-10 or a synthetic CIFAR-shaped task with kiln.
//!
//! ```text
//! cargo run --release --example resnet_ddp                       # synthetic data, defaults
//! cargo run --release --example resnet_ddp -- --data cifar-10-batches-bin --epochs 10 --width 64
//! ```

use std::process::ExitCode;

use burn::optim::SgdConfig;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use clap::Parser;
use kiln::core::{DeviceSpec, init_module};
use kiln::data::{Cifar10, DataLoader, ImageSource, SyntheticImages, Transform};
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
    #[arg(long, default_value_t = 64)]
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
    /// Devices, comma-separated: cpu, cpu:N, cuda:N, wgpu.
    #[arg(long, default_value = "cpu:0")]
    devices: String,
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
    let device = specs[0].device()?;
    if specs.len() > 1 {
        eprintln!("note: this build trains on one device; using {}", specs[0]);
    }
    let train_device = device.clone().autodiff();

    let (train, valid, transforms): (Box<dyn ImageSource>, Box<dyn ImageSource>, Vec<Transform>) =
        match &args.data {
            Some(dir) => {
                let mut transforms = Transform::cifar_augmentation();
                transforms.push(Transform::cifar_normalize());
                (
                    Box::new(Cifar10::train(dir)?),
                    Box::new(Cifar10::test(dir)?),
                    transforms,
                )
            }
            None => {
                let train = SyntheticImages::cifar_like(args.synthetic_samples, 10, args.seed);
                let valid = train.split(1_000, 1);
                (Box::new(train), Box::new(valid), Vec::new())
            }
        };
    let valid_transforms: Vec<Transform> = transforms
        .iter()
        .filter(|t| matches!(t, Transform::Normalize { .. }))
        .cloned()
        .collect();
    println!(
        "kiln: resnet{} width {} on {} | {} training / {} validation images | batch {}",
        args.model,
        args.width,
        specs[0],
        train.len(),
        valid.len(),
        args.batch_size
    );

    let config =
        ResNetConfig::from_depth(args.model, 10).ok_or("--model must be 18, 34, 50, 101 or 152")?;
    let model = init_module(&train_device, args.seed, || {
        config
            .with_stem(StemKind::Cifar)
            .with_base_width(args.width)
            .init(&train_device)
    });

    let train_loader = DataLoader::builder(train)
        .batch_size(args.batch_size)
        .num_workers(args.workers)
        .prefetch(args.prefetch)
        .shuffle(args.seed)
        .drop_last(true)
        .transforms(transforms)
        .device(train_device.clone())
        .build();
    let valid_loader = DataLoader::builder(valid)
        .batch_size(256)
        .num_workers(args.workers)
        .transforms(valid_transforms)
        .device(device.clone())
        .build();
    let steps_per_epoch = train_loader.num_batches();
    let total_steps = args.steps.unwrap_or(args.epochs * steps_per_epoch);
    let schedule = LrSchedule::constant(args.lr)
        .warmup((total_steps / 10).max(1))
        .cosine(total_steps, 0.0);
    let optimizer = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .with_weight_decay(Some(WeightDecayConfig::new(5e-4)))
        .init();

    let mut builder = Trainer::builder(model, optimizer)
        .schedule(schedule)
        .train_loader(train_loader)
        .valid_loader(valid_loader)
        .progress(!args.quiet);
    builder = match args.steps {
        Some(steps) => builder.max_steps(steps),
        None => builder.epochs(args.epochs),
    };
    let (_model, _report) = builder.build()?.fit()?;
    Ok(())
}
