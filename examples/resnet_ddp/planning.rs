//! `--plan`: profile the ResNet on the devices, predict the plans, print the choice.

use burn::tensor::Device;
use kiln::core::DeviceSpec;
use kiln::planner::{ModelProfile, Plan, PlanError, ProfileKey, RunPlanning};
use kiln::resnet::ResNet;
use kiln::train::Classification;

use crate::Setup;
use crate::args::Args;
use crate::conflicts::{data_parallel_only, pipeline_refuses};

type Error = Box<dyn std::error::Error>;

/// The plan this run trains with; `None` when nothing is left to choose (data parallel on
/// devices of one kind, equal batches, no memory limit): nothing is profiled then.
pub fn choose(
    args: &Args,
    setup: &Setup,
    devices: &[(String, DeviceSpec, Device)],
) -> Result<Option<Plan>, Error> {
    let n = devices.len();
    let (request, note) = args
        .planner
        .request(&data_parallel_only(args), &pipeline_refuses(args))?;
    if let Some(note) = note {
        println!("{note}");
    }
    let threads = args
        .step
        .threads
        .unwrap_or_else(|| kiln::ddp::default_threads_per_replica(n));
    let model = crate::checkpoints::model_name(args);
    let planning = RunPlanning::new(
        model,
        devices.to_vec(),
        args.batch_size * n,
        request,
        threads,
    )
    .fixed(args.pipeline.fixed());
    let planning = args.planner.apply(planning)?;
    let planned = planning.choose(|device, key| {
        profile_model(args, setup, device, key, threads)
            .map_err(|err| PlanError::Request(format!("profiling: {err}")))
    })?;
    for note in &planned.notes {
        println!("{note}");
    }
    if let Some(note) = args.planner.save(planned.plan.as_ref())? {
        println!("{note}");
    }
    Ok(planned.plan)
}

/// Profiles the model at each of the key's batch sizes on `device`, before any loader runs
/// (the CPU's kept activations are read from the process heap), with the run's optimizer.
fn profile_model(
    args: &Args,
    setup: &Setup,
    device: &Device,
    key: ProfileKey,
    threads: usize,
) -> Result<ModelProfile, Error> {
    let device = key.training_device(device);
    let model: ResNet = crate::build_model(args, setup, &device);
    let batch = setup
        .task
        .train_loader()
        .batch_size(*key.batches.last().expect("at least one batch size"))
        .device(device.clone())
        .build()
        .epoch(0)
        .next()
        .ok_or("the training set is smaller than one batch")??;
    let optimizer = crate::optimizer();
    let models = (&model, &Classification);
    Ok(kiln::planner::profile_model(
        key, models, &batch, &device, optimizer, threads,
    )?)
}
