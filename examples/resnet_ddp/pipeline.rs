//! `--pipeline P`: the ResNet cut into P stages (threads on the --devices entries), trained
//! with a GPipe, 1F1B or interleaved schedule, and a summary per stage.

use burn::tensor::Device;
use kiln::data::DataLoader;
use kiln::pipeline::{Pipeline, PipelineConfig};
use kiln::planner::prediction_line;
use kiln::resnet::ResNet;
use kiln::train::LrSchedule;

use crate::Setup;
use crate::args::Args;

/// The shape of a pipelined run: given by hand (--pipeline) or planned.
#[derive(Clone)]
pub struct PipelineRun {
    pub stages: usize,
    /// The schedule, micro-batches, split, data-parallel pipelines and recomputation (the
    /// rest of the configuration comes from the other options).
    pub shape: PipelineConfig,
    /// Samples of each pipeline's batch.
    pub batch_size: usize,
    /// The planner's predicted step seconds, shown beside the measured step.
    pub predicted_step: Option<f64>,
}

impl PipelineRun {
    /// `--pipeline P` with the pipeline options as given.
    pub fn by_hand(args: &Args, stages: usize) -> Self {
        Self {
            stages,
            shape: args.pipeline.config(PipelineConfig::default()),
            batch_size: args.batch_size,
            predicted_step: None,
        }
    }
}

/// Runs the pipeline, restarted from its latest checkpoint after a failure (`--max-restarts`,
/// in one process).
pub fn run_restarting(
    args: &Args,
    setup: &mut Setup,
    devices: Vec<Device>,
    shape: PipelineRun,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = setup.resume_from.clone();
    args.run.with_restarts(start, |from| {
        setup.resume_from = from.map(std::path::Path::to_path_buf);
        run(args, setup, devices.clone(), shape.clone())
    })
}

fn run(
    args: &Args,
    setup: &Setup,
    devices: Vec<Device>,
    shape: PipelineRun,
) -> Result<(), Box<dyn std::error::Error>> {
    let (stages, groups) = (shape.stages, shape.shape.data_parallel);
    // `--comm mpi`: one stage per process (rank = pipeline x P + stage), each on its own
    // `--devices` entry; rank 0 speaks.
    let world = across_processes(args)?;
    let primary = world.as_ref().is_none_or(|w| w.rank() == 0);
    let devices = stage_devices(devices, world.is_some(), stages, groups)?;
    macro_rules! say {
        ($($arg:tt)*) => {
            if primary {
                println!($($arg)*);
            }
        };
    }
    let config = pipeline_config(args, &shape);
    let (micro_batches, batch_size) = (config.micro_batches, shape.batch_size);
    let kind = config.schedule;
    if let Some(chart) = args.pipeline.chart(&config, stages)? {
        say!("{chart}");
    }
    let summary_config = config.clone();
    let mut loader = DataLoader::builder(std::sync::Arc::clone(&setup.train))
        .batch_size(batch_size)
        .num_workers(args.workers)
        .prefetch(args.prefetch)
        .shuffle(args.seed)
        .drop_last(true)
        .transforms(setup.transforms.clone())
        .device(config.train_device(&devices[0]))
        .build();
    // A step takes `--accumulation` batches per pipeline, run as one schedule.
    let steps = args
        .steps
        .unwrap_or(args.epochs * (loader.num_batches() / (groups * args.accumulation)));
    let step_samples = groups * batch_size * args.accumulation;
    if args.lr_scaling != kiln::train::LrScaling::None {
        say!("{}", args.lr_scaling.describe(args.lr, step_samples));
    }
    let schedule = LrSchedule::constant(args.lr_scaling.lr(args.lr, step_samples))
        .warmup((steps / 10).max(1))
        .cosine(steps, 0.0);
    say!(
        "kiln: resnet{} width {} | {groups} x {stages}-stage pipeline ({kind}, {} micro-batches of batch {} each, {} batches a step) on {} | {steps} steps",
        args.model,
        args.width,
        micro_batches,
        batch_size,
        args.accumulation,
        args.devices
    );
    let build = |device: &Device| -> ResNet { crate::build_model(args, setup, device) };
    let optimizer = crate::optimizer;
    // Checkpoints, a resume, SIGTERM and the run's log, as for data-parallel runs: the
    // checkpoint's format is the same, so either resumes the other. Across processes each
    // writes its stage's part into the shared run directory and rank 0 joins them.
    let identity = crate::checkpoints::identity(args, step_samples, steps);
    let valid_loader = DataLoader::builder(std::sync::Arc::clone(&setup.valid))
        .batch_size(256)
        .num_workers(args.workers)
        .transforms(setup.valid_transforms.clone())
        .device(devices[0].clone())
        .build();
    let mut pipeline = Pipeline::new(devices)
        .config(config)
        .valid_loader(valid_loader)
        .progress(primary && !args.quiet)
        .log_epochs(primary);
    if let Some(saver) = crate::checkpoints::saver(args, &identity) {
        pipeline = pipeline.checkpoint(saver.layout(
            "plan",
            format!("{groups} x {stages}-stage pipeline, {kind}, {micro_batches} micro-batches"),
        ));
    }
    let start = match &setup.resume_from {
        Some(path) => {
            let position = kiln::checkpoint::Manifest::read(path)?.position;
            say!(
                "resume: {} (step {}, epoch {}, step {} of it)",
                path.display(),
                position.step,
                position.epoch,
                position.step_in_epoch
            );
            pipeline = pipeline.resume(path, identity.clone());
            kiln::train::TrainPosition::from(position)
        }
        None => kiln::train::TrainPosition::default(),
    };
    if let Some(flag) = &setup.stop {
        pipeline = pipeline.stop_flag(flag.clone());
    }
    // Every process sees the same losses (summed over the world): rank 0 logs them.
    if primary && let Some(log) = args.run.run_log(&start)? {
        pipeline = pipeline.observer(log);
    }
    if let Some(world) = world {
        pipeline = pipeline_across(pipeline, world);
    }
    let report = pipeline.train(build, optimizer, &schedule, &mut loader, steps)?;
    if primary {
        print!("{}", report.summary(&summary_config, stages, step_samples)?);
        if let Some(predicted) = shape.predicted_step {
            let measured = Some(report.step_time.as_secs_f64());
            println!("{}", prediction_line(predicted, measured));
        }
    }
    Ok(())
}

/// Each stage's device, pipeline by pipeline: the `--devices` entries, or under MPI
/// (`across` processes) this process's one entry for its one stage.
fn stage_devices(
    devices: Vec<Device>,
    across: bool,
    stages: usize,
    groups: usize,
) -> Result<Vec<Device>, Box<dyn std::error::Error>> {
    let devices = match across {
        true if devices.len() == 1 => vec![devices[0].clone(); groups * stages],
        true => {
            return Err(format!(
                "--comm mpi --pipeline {stages} --data-parallel {groups}: each process runs one stage on its one --devices entry, got {}",
                devices.len()
            )
            .into());
        }
        false => devices,
    };
    if devices.len() != groups * stages {
        return Err(format!(
            "--pipeline {stages} --data-parallel {groups} needs {} --devices entries (one per stage of each pipeline), got {}",
            groups * stages,
            devices.len()
        )
        .into());
    }
    Ok(devices)
}

/// The pipeline's configuration from the options and the run's shape.
fn pipeline_config(args: &Args, run: &PipelineRun) -> PipelineConfig {
    PipelineConfig {
        threads_per_stage: args.threads,
        max_grad_norm: args.clip_grad_norm,
        precision: kiln::amp::MixedPrecision::new(args.amp),
        accumulation: args.accumulation,
        check_every: args.check_every,
        // `--inject-fault panic-at-step:N`: the last stage panics at step N (in the first
        // attempt only: a restarted run does not fail again).
        panic_at_step: args
            .inject_fault
            .as_ref()
            .filter(|fault| fault.take())
            .map(|fault| fault.step()),
        ..run.shape.clone()
    }
}

/// With `--comm mpi`, the MPI world (one stage per process).
#[cfg(feature = "mpi")]
fn across_processes(
    args: &Args,
) -> Result<Option<kiln::comm::Communicator>, Box<dyn std::error::Error>> {
    if args.comm != crate::args::CommArg::Mpi {
        return Ok(None);
    }
    let timeout = kiln::ddp::DdpConfig::default().timeout;
    Ok(Some(kiln::comm::MpiCommunicator::world(timeout)?))
}

#[cfg(not(feature = "mpi"))]
fn across_processes(
    args: &Args,
) -> Result<Option<kiln::comm::Communicator>, Box<dyn std::error::Error>> {
    if args.comm == crate::args::CommArg::Mpi {
        return Err("--comm mpi needs the example built with `--features mpi`".into());
    }
    Ok(None)
}

#[cfg(feature = "mpi")]
fn pipeline_across(pipeline: Pipeline, world: kiln::comm::Communicator) -> Pipeline {
    pipeline.across_processes(world)
}

#[cfg(not(feature = "mpi"))]
fn pipeline_across(pipeline: Pipeline, _: kiln::comm::Communicator) -> Pipeline {
    pipeline
}
