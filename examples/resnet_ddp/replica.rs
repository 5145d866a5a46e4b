//! One data-parallel replica: what it trains (model, data share, schedule, checkpoints)
//! and what it reports, in this process's threads or under MPI.

use kiln::data::ImageBatch;
use kiln::ddp::{DdpConfig, Replica, ReplicaOutcome};
use kiln::resnet::ResNet;
use kiln::train::{Classification, FaultyStep, GradientStep, TrainError, Trainer, TrainerBuilder};

use crate::args::Args;
use crate::{Setup, build_model, checkpoints, optimizer};

pub(crate) fn announce(args: &Args, setup: &Setup, world: usize, placement: &str) {
    let batch = match &setup.planned_batches {
        Some(batches) if batches.iter().any(|&b| b != batches[0]) => format!("{batches:?}"),
        Some(batches) => format!("{} x {world}", batches[0]),
        None => format!("{} x {world}", args.batch_size),
    };
    println!(
        "kiln: resnet{} width {} | {world} replica(s) on {placement} | {} training / {} validation images | batch {batch} x {} accumulation",
        args.model,
        args.width,
        setup.task.train.len(),
        setup.task.valid.len(),
        args.step.accumulation
    );
}

/// Under `mpirun`: every process trains one replica per entry of `--devices` (processes ×
/// local devices), MPI between processes and shared memory within each.
pub(crate) fn run_mpi(
    args: &Args,
    setup: &Setup,
    devices: Vec<burn::tensor::Device>,
    config: DdpConfig,
) -> Result<Vec<ReplicaOutcome>, Box<dyn std::error::Error>> {
    let mpi = kiln::comm::Communicator::mpi_world(config.timeout)?;
    let (process, processes, local) = (mpi.rank(), mpi.world_size(), devices.len());
    if process == 0 {
        let placement = format!(
            "{processes} MPI process(es) x {local} local device(s) ({})",
            args.devices
        );
        announce(args, setup, processes * local, &placement);
    }
    Ok(kiln::ddp::DataParallel::new(devices)
        .config(config)
        .run_mpi(mpi, |replica| train_replica(replica, args, setup))?)
}

pub(crate) fn train_replica(
    replica: Replica,
    args: &Args,
    setup: &Setup,
) -> Result<ReplicaOutcome, TrainError> {
    let device = replica.train_device();
    let primary = replica.is_primary();
    let model = replica.broadcast_module(build_model(args, setup, &device))?;
    let (batch_size, shares) = batch_share(&replica, args, setup, &model, &device)?;
    let mut train_loader = args
        .loader
        .apply(setup.task.train_loader())
        .batch_size(batch_size)
        .shuffle(args.seed)
        .drop_last(true)
        .shard(replica.rank(), replica.world_size())
        .device(device.clone());
    if let Some(shares) = shares {
        train_loader = train_loader.shard_batches(shares);
    }
    let train_loader = train_loader.build();
    let steps_per_epoch = train_loader.num_batches() / args.step.accumulation;
    let total_steps = args.steps.unwrap_or(args.epochs * steps_per_epoch);
    let step_samples = if args.balance {
        args.planner
            .global_batch
            .unwrap_or(args.batch_size * replica.world_size())
    } else if let Some(batches) = &setup.planned_batches {
        batches.iter().sum()
    } else {
        args.batch_size * replica.world_size()
    } * args.step.accumulation;
    let schedule = crate::lr_schedule(args, total_steps, step_samples, primary);
    let attempt = checkpoints::attempt(args, setup, step_samples, total_steps);
    // Under ZeRO-1 the optimizer keeps (and resumes) the state of its own parameters only.
    let owned = replica.optimizer_shard(&model);
    let start =
        (attempt.start(model, optimizer(), owned.as_deref())).map_err(TrainError::checkpoint)?;
    let (model, optimizer, position) = (start.model, start.optimizer, start.position);
    if let Some(line) = attempt.resume_line(&position).filter(|_| primary) {
        println!("{line}");
    }
    let mut step = args.ddp.step_with(&replica, Classification);
    GradientStep::<ResNet>::restore_state(&mut step, &start.step_state)?;
    let watch = step.watch(replica.rank());
    let builder = Trainer::builder(model, optimizer)
        .schedule(schedule)
        .train_loader(train_loader)
        .accumulation_steps(args.step.accumulation)
        .progress(primary && !args.quiet)
        .log_epochs(primary);
    let ranks = (replica.rank(), replica.world_size());
    let mut builder = attempt.replica_trainer(builder, &position, ranks, owned.is_some())?;
    if primary {
        builder = primary_extras(builder, &replica, args, setup);
    }
    builder = match args.steps {
        Some(steps) => builder.max_steps(steps),
        None => builder.epochs(args.epochs),
    };
    // The last replica carries an injected fault, if asked for (only then is the step
    // wrapped: a run without one takes the step as it is).
    let fault = (replica.rank() + 1 == replica.world_size())
        .then(|| args.inject_fault.clone())
        .flatten();
    let (model, report) = match fault {
        Some(fault) => builder
            .gradient_step(FaultyStep::new(step, Some(fault)))
            .build()?
            .fit()?,
        None => builder.gradient_step(step).build()?.fit()?,
    };
    Ok(watch.finish(report, &model))
}

/// This replica's batch and, for uneven shares, every replica's: balanced from measured
/// throughput (`--balance`), the plan's, or `--batch-size`.
fn batch_share(
    replica: &Replica,
    args: &Args,
    setup: &Setup,
    model: &ResNet,
    device: &burn::tensor::Device,
) -> Result<(usize, Option<Vec<usize>>), TrainError> {
    // Uneven shares take each step's samples as parts of a contiguous run of the epoch's
    // order, whatever the split: a checkpoint resumes on another split with the same steps.
    Ok(if args.balance {
        let split = replica.split_batch(
            measure_throughput(model, setup, args, device)?,
            args.planner
                .global_batch
                .unwrap_or(args.batch_size * replica.world_size()),
        )?;
        if replica.is_primary() {
            println!(
                "balanced batches {:?} from measured {:?} img/s",
                split.batches, split.throughput
            );
        }
        (split.batches[replica.rank()], Some(split.batches.clone()))
    } else if let Some(batches) = &setup.planned_batches
        && batches.iter().any(|&b| b != batches[0])
    {
        (batches[replica.rank()], Some(batches.clone()))
    } else if let Some(batches) = &setup.planned_batches {
        (batches[0], None)
    } else {
        (args.batch_size, None)
    })
}

/// What only the primary replica does: the kernel-profile marks and validation.
fn primary_extras<S: GradientStep<ResNet, ImageBatch>>(
    mut builder: TrainerBuilder<ResNet, S>,
    replica: &Replica,
    args: &Args,
    setup: &Setup,
) -> TrainerBuilder<ResNet, S> {
    if let Some(file) = &args.gpu.profile_kernels {
        builder = builder.observer(kiln::train::SteadyStateMark::new(
            file,
            args.gpu.profile_warmup,
            replica.device().clone(),
        ));
    }
    let valid_loader = (args.loader.apply(setup.task.valid_loader()))
        .batch_size(256)
        .device(replica.device().clone())
        .build();
    builder.valid_loader(valid_loader)
}

/// This replica's training throughput (images/s) over a few probe steps on its device, in
/// the precision training will use.
fn measure_throughput(
    model: &ResNet,
    setup: &Setup,
    args: &Args,
    device: &burn::tensor::Device,
) -> Result<f64, TrainError> {
    let mut probe = setup
        .task
        .train_loader()
        .batch_size(args.batch_size)
        .device(device.clone())
        .build();
    let batches: Vec<_> = probe.epoch(0).take(4).collect::<Result<_, _>>()?;
    let precision = args.step.precision();
    kiln::train::measure_throughput(model, &Classification, batches, &precision, device)
}
