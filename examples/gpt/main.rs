//! Trains a GPT-style language model on text: data parallel over `--devices`, or in pipeline
//! stages (`--pipeline P`), then reports the held-out loss against the unigram baseline,
//! tokens/s, and a sample of what it writes.
//!
//! ```text
//! cargo run --release --example gpt                          # 2 CPU replicas, the Jargon File
//! cargo run --release --example gpt -- --devices cpu:0       # one device
//! cargo run --release --example gpt -- --pipeline 2          # 2 stages (the last holds a copy of the tied embedding)
//! cargo run --release --example gpt -- --text my-notes.txt   # your own text (bytes)
//! ```

use std::process::ExitCode;
use std::time::Instant;

use burn::module::Module;
use burn::optim::AdamWConfig;
use burn::tensor::Device;
use clap::Parser;
use kiln::core::DeviceSpec;
use kiln::data::{TextCorpus, TextWindows};
use kiln::ddp::{DataParallel, DdpConfig};
use kiln::gpt::{Gpt, GptConfig};
use kiln::pipeline::{Pipeline, PipelineConfig};
use kiln::train::{LanguageModeling, LrSchedule, TrainReport, Trainer};

mod sample;

/// A GPT-style byte-level language model, trained with kiln.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Devices: one data-parallel replica per entry (`cpu:0,cpu:1`, `cuda:0`, `wgpu`), or one
    /// pipeline stage per entry with `--pipeline`.
    #[arg(long, default_value = "cpu:0,cpu:1")]
    devices: String,
    /// Pipeline stages instead of data-parallel replicas (one per `--devices` entry).
    #[arg(long)]
    pipeline: Option<usize>,
    /// Micro-batches per pipeline step.
    #[arg(long, default_value_t = 4)]
    micro_batches: usize,
    /// A text file to train on (bytes; any encoding) instead of the shipped Jargon File.
    #[arg(long)]
    text: Option<std::path::PathBuf>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 600)]
    steps: usize,
    /// Windows per step (over every replica).
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Tokens per window (the model's context).
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    width: usize,
    /// An output head of its own instead of the token embedding (tied, a pipeline's last
    /// stage holds a copy of the embedding and the stages sum its gradient every step).
    #[arg(long)]
    untied: bool,
    /// Every this many steps (0: never), replicas compare their parameters bit for bit, and
    /// a pipeline's stages their copies of the tied embedding; a difference ends the run.
    #[arg(long, default_value_t = 0)]
    check_every: usize,
    /// AdamW's peak learning rate (after 50 warm-up steps, cosine to a tenth).
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Seed of the model and the windows.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bytes to generate at the end.
    #[arg(long, default_value_t = 240)]
    sample: usize,
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
    let devices = DeviceSpec::parse_list(&args.devices)?
        .iter()
        .map(DeviceSpec::device)
        .collect::<Result<Vec<_>, _>>()?;
    let corpus = match &args.text {
        Some(path) => TextCorpus::from_file(path)?,
        None => TextCorpus::jargon_file(),
    };
    let (train, held_out) = corpus.split(0.05)?;
    let config = GptConfig::new(256, args.context, args.layers, args.heads, args.width)
        .with_tied(!args.untied);
    let plan = match args.pipeline {
        Some(stages) if stages != devices.len() => {
            return Err(format!(
                "--pipeline {stages} needs {stages} --devices entries, got {}",
                devices.len()
            )
            .into());
        }
        Some(stages) => format!(
            "{stages}-stage pipeline (1F1B, {} micro-batches)",
            args.micro_batches
        ),
        None => format!("{} data-parallel replica(s)", devices.len()),
    };
    println!(
        "kiln gpt: {} parameters ({} layers, {} heads, width {}, context {}, {}) | {plan} on {} | {} ({} training, {} held-out bytes)",
        config.param_count(),
        args.layers,
        args.heads,
        args.width,
        args.context,
        if config.tied {
            "tied head"
        } else {
            "untied head"
        },
        args.devices,
        corpus.name(),
        train.len(),
        held_out.len()
    );
    let schedule = LrSchedule::constant(args.lr)
        .warmup(50.min(args.steps / 4))
        .cosine(args.steps, args.lr / 10.0);
    let data = Data {
        train,
        held_out: held_out.clone(),
        config,
        schedule,
    };
    let started = Instant::now();
    let (report, model) = match args.pipeline {
        None => data_parallel(&args, &data, devices)?,
        Some(_) => pipelined(&args, &data, devices)?,
    };
    let seconds = started.elapsed().as_secs_f64();
    let tokens = args.steps * args.batch_size * args.context;
    let last = report.epochs.last().ok_or("no epoch was summarised")?;
    let held_out_loss = last.valid_loss.ok_or("no held-out loss")?;
    println!(
        "held-out loss {held_out_loss:.3} nats/byte (perplexity {:.2}) | unigram baseline {:.3} | {:.0} tokens/s over {seconds:.1} s",
        f64::from(held_out_loss).exp(),
        held_out.unigram_loss(),
        tokens as f64 / seconds.max(1e-9)
    );
    let text = sample::generate(&model, b"The ", args.sample, args.context, args.seed);
    println!(
        "sample (top-5, from \"The \"):\n{}",
        String::from_utf8_lossy(&text)
    );
    Ok(())
}

/// What every plan trains on and with.
struct Data {
    train: TextCorpus,
    held_out: TextCorpus,
    config: GptConfig,
    schedule: LrSchedule,
}

impl Data {
    /// The model for `--seed`, the same on every device kind.
    fn build(&self, seed: u64, device: &Device) -> Gpt {
        kiln::core::init_on_host(device, seed, |d| self.config.init(d))
    }

    /// The held-out text cut end to end, on `device`.
    fn held_out_windows(&self, device: Device) -> Result<TextWindows, kiln::data::DataError> {
        TextWindows::builder(self.held_out.clone())
            .context(self.config.context)
            .batch_size(64)
            .sequential()
            .device(device)
            .build()
    }
}

/// One replica per device, each on its shard of every step's windows; the first replica's
/// report and trained model.
fn data_parallel(
    args: &Args,
    data: &Data,
    devices: Vec<Device>,
) -> Result<(TrainReport, Gpt), Box<dyn std::error::Error>> {
    let replicas = devices.len();
    if !args.batch_size.is_multiple_of(replicas) {
        return Err(format!(
            "--batch-size {} does not split over {replicas} replicas",
            args.batch_size
        )
        .into());
    }
    let config = DdpConfig {
        divergence_check_every: args.check_every,
        ..DdpConfig::default()
    };
    let mut outcomes = DataParallel::new(devices).config(config).run(|replica| {
        let device = replica.train_device();
        let model = replica.broadcast_module(data.build(args.seed, &device))?;
        let windows = TextWindows::builder(data.train.clone())
            .context(args.context)
            .batch_size(args.batch_size / replicas)
            .shard(replica.rank(), replicas)
            .seed(args.seed)
            .device(device.clone())
            .build()?;
        let primary = replica.rank() == 0;
        let mut trainer =
            Trainer::with_objective(model, AdamWConfig::new().init(), LanguageModeling)
                .gradient_step(replica.overlapped_step_with(LanguageModeling))
                .schedule(data.schedule)
                .train_loader(windows)
                .max_steps(args.steps)
                .progress(primary && !args.quiet)
                .log_epochs(primary);
        if primary {
            trainer = trainer.valid_loader(data.held_out_windows(replica.device().clone())?);
        }
        trainer.build()?.fit()
    })?;
    let (model, report) = outcomes.swap_remove(0);
    Ok((report, model.valid()))
}

/// One stage per device (1F1B); the run's report and the stages' trained parameters put
/// back into one model.
fn pipelined(
    args: &Args,
    data: &Data,
    devices: Vec<Device>,
) -> Result<(TrainReport, Gpt), Box<dyn std::error::Error>> {
    let mut windows = TextWindows::builder(data.train.clone())
        .context(args.context)
        .batch_size(args.batch_size)
        .seed(args.seed)
        .device(devices[0].clone().autodiff())
        .build()?;
    let config = PipelineConfig {
        micro_batches: args.micro_batches,
        check_every: args.check_every,
        ..PipelineConfig::default()
    };
    let report = Pipeline::with_objective(devices.clone(), LanguageModeling)
        .config(config)
        .valid_loader(data.held_out_windows(devices[0].clone())?)
        .progress(!args.quiet)
        .log_epochs(true)
        .train(
            |device: &Device| data.build(args.seed, device),
            || AdamWConfig::new().init(),
            &data.schedule,
            &mut windows,
            args.steps,
        )?;
    let model = sample::with_params(data.build(args.seed, &Device::flex()), &report.params)?;
    println!(
        "step {:.1} ms (after the first)",
        report.step_time.as_secs_f64() * 1e3
    );
    let run = TrainReport {
        steps: Vec::new(),
        epochs: report.epochs,
        stopped_at: report.stopped_at,
        first_step: None,
    };
    Ok((run, model))
}
