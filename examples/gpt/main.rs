//! Trains a GPT-style language model on text: data parallel over `--devices`, or in pipeline
//! stages (`--pipeline P`), then reports the held-out loss against the unigram baseline,
//! tokens/s, and a sample of what it writes.
//!
//! ```text
//! cargo run --release --example gpt                          # the planner's plan, the Jargon File
//! cargo run --release --example gpt -- --device-memory 50MB  # no replica fits: pipeline stages
//! cargo run --release --example gpt -- --devices cpu:0       # one device
//! cargo run --release --example gpt -- --pipeline 2          # 2 stages (the last holds a copy of the tied embedding)
//! cargo run --release --example gpt -- --text my-notes.txt   # your own text (bytes)
//! ```

use std::process::ExitCode;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::Device;
use clap::Parser;
use kiln::checkpoint::RunOptions;
use kiln::core::DeviceSpec;
use kiln::data::{TextCorpus, TextWindows};
use kiln::ddp::{DataParallel, DdpConfig};
use kiln::gpt::{Gpt, GptConfig};
use kiln::kernels::FusedAdamWConfig;
use kiln::pipeline::{Pipeline, PipelineOptions, PipelineShape};
use kiln::planner::{PlanOptions, PlanRequest};

use crate::layout::{chosen, plan_request};
use kiln::train::{
    LanguageModeling, LrSchedule, TrainReport, Trainer, positive_count, positive_rate,
};

mod checkpoints;
mod layout;
mod planning;
mod sample;

// The planner measures activation memory through it.
#[global_allocator]
static ALLOCATOR: kiln::planner::TrackingAllocator = kiln::planner::TrackingAllocator;

/// A GPT-style byte-level language model, trained with kiln.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// Devices: one data-parallel replica per entry (`cpu:0,cpu:1`, `cuda:0`, `wgpu`), or one
    /// pipeline stage per entry with `--pipeline`.
    #[arg(long, default_value = "cpu:0,cpu:1", global = true)]
    devices: String,
    /// A task instead of training: `doctor` (check this build and machine), `selftest`
    /// (data-parallel training on `--devices` against one device), `launch` (a job run again
    /// after it fails).
    #[command(subcommand)]
    command: Option<kiln::doctor::Task>,
    /// Pipelines by hand instead of the planner's choice: `--pipeline P` (one stage per
    /// `--devices` entry, D x P with `--data-parallel D`), `--micro-batches`, `--schedule`,
    /// `--show-schedule`, `--split`; nothing is profiled.
    #[command(flatten)]
    pipeline: PipelineOptions,
    /// The planner: `--plan auto|dp|pp=N|dp=A,pp=B|FILE`, `--device-memory`,
    /// `--profile-cache`, `--predict`, `--save-plan` (`--global-batch` is --batch-size here).
    #[command(flatten)]
    planner: PlanOptions,
    /// A text file to train on (bytes; any encoding) instead of the shipped Jargon File.
    #[arg(long)]
    text: Option<std::path::PathBuf>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 600, value_parser = positive_count)]
    steps: usize,
    /// Windows per batch (over every replica; a step takes --accumulation batches).
    #[arg(long, default_value_t = 32, value_parser = positive_count)]
    batch_size: usize,
    /// Tokens per window (the model's context).
    #[arg(long, default_value_t = 64, value_parser = positive_count)]
    context: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4, value_parser = positive_count)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4, value_parser = positive_count)]
    heads: usize,
    /// Model width.
    #[arg(long, default_value_t = 128, value_parser = positive_count)]
    width: usize,
    /// An output head of its own instead of the token embedding (tied, a pipeline's last
    /// stage holds a copy of the embedding and the stages sum its gradient every step).
    #[arg(long)]
    untied: bool,
    /// AdamW's weight decay, on the weight matrices only (not biases, norms, embeddings).
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f32,
    /// AdamW's peak learning rate (after 50 warm-up steps, cosine to a tenth).
    #[arg(long, default_value_t = 2e-3, value_parser = positive_rate)]
    lr: f64,
    /// Seed of the model and the windows.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bytes to generate at the end.
    #[arg(long, default_value_t = 240)]
    sample: usize,
    /// The step: `--amp`, `--clip-grad-norm`, `--accumulation` (batches per step),
    /// `--check-every` (replicas' parameters, or a pipeline's copies of the tied embedding,
    /// compared bit for bit), `--threads`.
    #[command(flatten)]
    step: kiln::train::StepOptions,
    /// The run's directory, checkpoints, resume and restarts (`--run-dir`,
    /// `--checkpoint-every`, `--keep`, `--resume`, `--max-restarts`), under any plan.
    #[command(flatten)]
    run: RunOptions,
    /// ZeRO-1: each data-parallel replica keeps the optimizer state of its share of the
    /// parameters (AdamW's two moments: 2/3 of the training state) and updates only those.
    #[arg(long)]
    zero1: bool,
    /// GPU backends: `--gpu-cache`, `--autotune-level`, `--profile-kernels` (data parallel),
    /// `--profile-warmup`.
    #[command(flatten)]
    gpu: kiln::core::gpu_options::GpuOptions,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    // Every step frees and allocates the same large buffers: keeping them in the process
    // spares the page faults of taking them back from the system each step (as the bench
    // and the ResNet example do).
    if let Err(err) = kiln::core::retain_freed_memory() {
        eprintln!("note: {err}");
    }
    let args = Args::parse();
    // Before any GPU is touched.
    if let Err(err) = args.gpu.apply() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    if let Some(task) = &args.command {
        return match task.run(&args.devices, false) {
            true => ExitCode::SUCCESS,
            false => ExitCode::FAILURE,
        };
    }
    let placement = format!(
        "--devices {}, --batch-size {}",
        args.devices, args.batch_size
    );
    match run(args) {
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

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let named = DeviceSpec::open_list(&args.devices)?;
    let specs: Vec<DeviceSpec> = named.iter().map(|(_, spec, _)| *spec).collect();
    let devices: Vec<Device> = named.iter().map(|(_, _, device)| device.clone()).collect();
    let corpus = match &args.text {
        Some(path) => TextCorpus::from_file(path)?,
        None => TextCorpus::jargon_file(),
    };
    let (train, held_out) = corpus.split(0.05)?;
    args.run.check()?;
    args.gpu.check(&specs)?;
    if let Some(note) = args.step.note_for(&specs) {
        eprintln!("{note}");
    }
    let request = plan_request(&args)?;
    let identity = checkpoints::identity(&args, corpus.name());
    let from = args.run.resume_from()?;
    let config = GptConfig::new(
        checkpoints::BYTE_VOCABULARY,
        args.context,
        args.layers,
        args.heads,
        args.width,
    )
    .with_tied(!args.untied);
    println!(
        "kiln gpt: {} parameters ({} layers, {} heads, width {}, context {}, {}) on {} | {} ({} training, {} held-out bytes)",
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
        identity,
        from,
        stop: args.run.stop_on_sigterm()?,
    };
    let layout = choose_layout(&args, &data, request, &named)?;
    println!("plan: {}", layout.0);
    if layout.1.is_some() && args.gpu.profile_kernels.is_some() {
        return Err("--profile-kernels marks the steady state of data-parallel runs; a pipeline's kernels are not profiled yet".into());
    }
    let started = Instant::now();
    // A failed attempt restarts from the latest checkpoint (--max-restarts).
    let attempt = |from: Option<&std::path::Path>| -> Result<_, Box<dyn std::error::Error>> {
        match &layout.1 {
            None => {
                let (report, model) = data_parallel(&args, &data, from, devices.clone())?;
                // The median step after the first (none with one step: nothing to compare).
                let step_windows = args.batch_size / devices.len() * args.step.accumulation;
                let measured = report.median_step_seconds(step_windows);
                Ok(((report, model), measured))
            }
            Some(stages) => pipelined(&args, &data, from, devices.clone(), stages),
        }
    };
    let ((report, model), measured) = args.run.with_restarts(data.from.clone(), attempt)?;
    let seconds = started.elapsed().as_secs_f64();
    match layout.2 {
        Some(_) if args.step.accumulation > 1 => println!(
            "prediction: not compared (the planner predicts steps of one batch, these took {})",
            args.step.accumulation
        ),
        Some(predicted) => println!("{}", kiln::planner::prediction_line(predicted, measured)),
        None => {}
    }
    // A resumed run trains from its checkpoint's step.
    let first = match &data.from {
        Some(path) => kiln::checkpoint::Manifest::read(path)?.position.step,
        None => 0,
    };
    let tokens =
        args.steps.saturating_sub(first) * args.batch_size * args.step.accumulation * args.context;
    let last = report.epochs.last().ok_or("no epoch was summarised")?;
    let held_out_loss = last.valid_loss.ok_or("no held-out loss")?;
    println!(
        "held-out loss {held_out_loss:.3} nats/byte (perplexity {:.2}) | unigram baseline {:.3} | {:.0} tokens/s over {seconds:.1} s",
        f64::from(held_out_loss).exp(),
        held_out.unigram_loss(),
        tokens as f64 / seconds.max(1e-9)
    );
    // Equal fingerprints: bit-identical parameters (CI compares a resumed run's).
    println!(
        "parameters fingerprint: {:016x}",
        kiln::core::fingerprint(&model)
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
    /// The run, as its checkpoints name it.
    identity: kiln::checkpoint::RunIdentity,
    /// The checkpoint it starts from.
    from: Option<std::path::PathBuf>,
    /// Raised by SIGTERM when the run has a directory: stop at the next step, saved.
    stop: Option<kiln::train::StopFlag>,
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
    from: Option<&std::path::Path>,
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
        zero1: args.zero1,
        ..DdpConfig::default().with_steps(&args.step)
    };
    let attempt = args.run.attempt(&data.identity, from, data.stop.as_ref());
    let mut outcomes = DataParallel::new(devices).config(config).run(|replica| {
        let device = replica.train_device();
        let (model, optimizer) = (data.build(args.seed, &device), optimizer(args));
        // Under ZeRO-1 the optimizer keeps (and resumes) its own parameters' state only.
        let owned = replica.optimizer_shard(&model);
        // Every replica resumes from the checkpoint (they hold the same state).
        let start = (attempt.start(model, optimizer, owned.as_deref()))
            .map_err(kiln::train::TrainError::checkpoint)?;
        let (model, optimizer, position) = (start.model, start.optimizer, start.position);
        let primary = replica.rank() == 0;
        if let Some(line) = attempt.resume_line(&position).filter(|_| primary) {
            println!("{line}");
        }
        let model = replica.broadcast_module(model)?;
        let mut step = replica.overlapped_step_with(LanguageModeling);
        kiln::train::GradientStep::<Gpt, kiln::data::TokenBatch>::restore_state(
            &mut step,
            &start.step_state,
        )?;
        let windows = TextWindows::builder(data.train.clone())
            .context(args.context)
            .batch_size(args.batch_size / replicas)
            .shard(replica.rank(), replicas)
            .seed(args.seed)
            .device(device.clone())
            .build()?;
        let trainer = Trainer::with_objective(model, optimizer, LanguageModeling)
            .gradient_step(step)
            .schedule(data.schedule)
            .train_loader(windows)
            .max_steps(args.steps)
            .accumulation_steps(args.step.accumulation)
            .progress(primary && !args.quiet)
            .log_epochs(primary);
        let ranks = (replica.rank(), replica.world_size());
        let mut trainer = attempt.replica_trainer(trainer, &position, ranks, owned.is_some())?;
        if primary {
            trainer = trainer.valid_loader(data.held_out_windows(replica.device().clone())?);
            if let Some(file) = &args.gpu.profile_kernels {
                let warmup = args.gpu.profile_warmup;
                let mark = kiln::train::SteadyStateMark::new(file, warmup, device.clone());
                trainer = trainer.observer(mark);
            }
        }
        trainer.build()?.fit()
    })?;
    let (model, report) = outcomes.swap_remove(0);
    Ok((report, model.valid()))
}

/// A run's report and trained model, and its measured step (seconds; none with one step).
type Trained = ((TrainReport, Gpt), Option<f64>);

/// The pipelines of `stages` over `devices`; the run's report and the stages' trained
/// parameters put back into one model, and the measured step (seconds; none with one step).
fn pipelined(
    args: &Args,
    data: &Data,
    from: Option<&std::path::Path>,
    devices: Vec<Device>,
    stages: &PipelineShape,
) -> Result<Trained, Box<dyn std::error::Error>> {
    let pipelines = stages.config.data_parallel;
    if !args.batch_size.is_multiple_of(pipelines) {
        return Err(format!(
            "--batch-size {} does not split over {pipelines} pipelines",
            args.batch_size
        )
        .into());
    }
    let config = stages.config.clone().with_steps(&args.step);
    if let Some(chart) = args.pipeline.chart(&config, stages.stages)? {
        println!("{chart}");
    }
    // Each step takes one batch per pipeline.
    let mut windows = TextWindows::builder(data.train.clone())
        .context(args.context)
        .batch_size(args.batch_size / pipelines)
        .seed(args.seed)
        .device(config.train_device(&devices[0]))
        .build()?;
    let attempt = args.run.attempt(&data.identity, from, data.stop.as_ref());
    let (pipeline, position) = Pipeline::with_objective(devices.clone(), LanguageModeling)
        .config(config)
        .valid_loader(data.held_out_windows(devices[0].clone())?)
        .progress(!args.quiet)
        .log_epochs(true)
        .attempt(&attempt, true)?;
    if let Some(line) = attempt.resume_line(&position) {
        println!("{line}");
    }
    let report = pipeline.train(
        |device: &Device| data.build(args.seed, device),
        || optimizer(args),
        &data.schedule,
        &mut windows,
        args.steps,
    )?;
    let model = sample::with_params(data.build(args.seed, &Device::flex()), &report.params)?;
    let measured = (!report.step_time.is_zero()).then_some(report.step_time.as_secs_f64());
    let run = TrainReport {
        steps: Vec::new(),
        epochs: report.epochs,
        stopped_at: report.stopped_at,
        first_step: None,
    };
    Ok(((run, model), measured))
}

/// The layout to train in: `--pipeline`'s by hand, else the planner's for `request`.
fn choose_layout(
    args: &Args,
    data: &Data,
    request: PlanRequest,
    devices: &[(String, DeviceSpec, Device)],
) -> Result<layout::Chosen, Box<dyn std::error::Error>> {
    Ok(match (PipelineShape::by_hand(&args.pipeline), request) {
        (Some(shape), _) => {
            shape.check_devices(devices.len())?;
            layout::by_hand(shape)
        }
        (None, request) => {
            let plan = planning::choose(args, data, request, devices)?;
            if let Some(note) = args.planner.save(plan.as_ref())? {
                println!("{note}");
            }
            chosen(plan, devices.len())?
        }
    })
}

/// AdamW with `--weight-decay` on the weight matrices only (`kiln::gpt::adamw`).
fn optimizer(args: &Args) -> burn::optim::ModuleOptimizer {
    kiln::gpt::adamw(&FusedAdamWConfig::new().with_weight_decay(args.weight_decay))
}
