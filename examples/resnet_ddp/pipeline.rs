//! `--pipeline P`: the ResNet cut into P stages (threads on the --devices entries), trained
//! with a GPipe, 1F1B or interleaved schedule, and a summary per stage.

use burn::tensor::Device;
use kiln::pipeline::{Pipeline, PipelineConfig, PipelineShape};
use kiln::planner::prediction_line;
use kiln::resnet::ResNet;

use crate::Setup;
use crate::args::Args;

/// Runs the pipeline, restarted from its latest checkpoint after a failure (`--max-restarts`,
/// in one process).
/// `batch_size`: samples of each pipeline's batch.
pub fn run_restarting(
    args: &Args,
    setup: &mut Setup,
    devices: Vec<Device>,
    (shape, batch_size): (PipelineShape, usize),
) -> Result<(), Box<dyn std::error::Error>> {
    let start = setup.resume_from.clone();
    args.run.with_restarts(start, |from| {
        setup.resume_from = from.map(std::path::Path::to_path_buf);
        run(args, setup, devices.clone(), &shape, batch_size)
    })
}

fn run(
    args: &Args,
    setup: &Setup,
    devices: Vec<Device>,
    shape: &PipelineShape,
    batch_size: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (stages, groups) = (shape.stages, shape.config.data_parallel);
    // `--comm mpi`: one stage per process (rank = pipeline x P + stage), each on its own
    // `--devices` entry; rank 0 speaks.
    let world = across_processes(args)?;
    let primary = world.as_ref().is_none_or(|w| w.rank() == 0);
    let devices = stage_devices(devices, world.is_some(), shape)?;
    macro_rules! say {
        ($($arg:tt)*) => {
            if primary {
                println!($($arg)*);
            }
        };
    }
    let config = pipeline_config(args, shape);
    let micro_batches = config.micro_batches;
    let kind = config.schedule;
    if let Some(chart) = args.pipeline.chart(&config, stages)? {
        say!("{chart}");
    }
    let summary_config = config.clone();
    let mut loader = args
        .loader
        .apply(setup.task.train_loader())
        .batch_size(batch_size)
        .shuffle(args.seed)
        .drop_last(true)
        .device(config.train_device(&devices[0]))
        .build();
    // A step takes `--accumulation` batches per pipeline, run as one schedule.
    let steps = args
        .steps
        .unwrap_or(args.epochs * (loader.num_batches() / (groups * args.step.accumulation)));
    let step_samples = groups * batch_size * args.step.accumulation;
    let schedule = crate::lr_schedule(args, steps, step_samples, primary);
    say!(
        "kiln: resnet{} width {} | {groups} x {stages}-stage pipeline ({kind}, {} micro-batches of batch {} each, {} batches a step) on {} | {steps} steps",
        args.model,
        args.width,
        micro_batches,
        batch_size,
        args.step.accumulation,
        args.devices
    );
    let build = |device: &Device| -> ResNet { crate::build_model(args, setup, device) };
    let optimizer = crate::optimizer;
    // Checkpoints, a resume, SIGTERM and the run's log, as for data-parallel runs: the
    // checkpoint's format is the same, so either resumes the other. Across processes each
    // writes its stage's part into the shared run directory and rank 0 joins them.
    let plan = format!("{groups} x {stages}-stage pipeline, {kind}, {micro_batches} micro-batches");
    let attempt =
        crate::checkpoints::attempt(args, setup, step_samples, steps).layout("plan", plan);
    let valid_loader = args
        .loader
        .apply(setup.task.valid_loader())
        .batch_size(256)
        .device(devices[0].clone())
        .build();
    // Every process sees the same losses (summed over the world): rank 0 logs them.
    let (mut pipeline, start) = Pipeline::new(devices)
        .config(config)
        .valid_loader(valid_loader)
        .progress(primary && !args.quiet)
        .log_epochs(primary)
        .attempt(&attempt, primary)?;
    if let Some(line) = attempt.resume_line(&start) {
        say!("{line}");
    }
    if let Some(world) = world {
        pipeline = pipeline.across_processes(world);
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
    shape: &PipelineShape,
) -> Result<Vec<Device>, Box<dyn std::error::Error>> {
    if !across {
        shape.check_devices(devices.len())?;
        return Ok(devices);
    }
    if devices.len() != 1 {
        let (stages, groups) = (shape.stages, shape.config.data_parallel);
        return Err(format!(
            "--comm mpi --pipeline {stages} --data-parallel {groups}: each process runs one stage on its one --devices entry, got {}",
            devices.len()
        )
        .into());
    }
    Ok(vec![devices[0].clone(); shape.devices()])
}

/// The pipeline's configuration from the options and the run's shape.
fn pipeline_config(args: &Args, shape: &PipelineShape) -> PipelineConfig {
    PipelineConfig {
        // `--inject-fault panic-at-step:N`: the last stage panics at step N (in the first
        // attempt only: a restarted run does not fail again).
        panic_at_step: args
            .inject_fault
            .as_ref()
            .filter(|fault| fault.take())
            .map(|fault| fault.step()),
        ..shape.config.clone().with_steps(&args.step)
    }
}

/// With `--comm mpi`, the MPI world (one stage per process).
fn across_processes(
    args: &Args,
) -> Result<Option<kiln::comm::Communicator>, Box<dyn std::error::Error>> {
    if args.comm != crate::args::CommArg::Mpi {
        return Ok(None);
    }
    let timeout = kiln::ddp::DdpConfig::default().timeout;
    Ok(Some(kiln::comm::Communicator::mpi_world(timeout)?))
}
