//! `--plan`: profile the ResNet on the devices, predict the plans, print the choice.

use std::sync::Arc;

use burn::tensor::Device;
use kiln::core::DeviceSpec;
use kiln::data::DataLoader;
use kiln::planner::{
    BatchProfile, Fixed, ModelProfile, Plan, PlanError, PlanRequest, ProfileKey, ProfileOptions,
    RunPlanning, parse_memory_limits, profile_segments, profile_update,
};
use kiln::resnet::ResNet;

use crate::Setup;
use crate::args::Args;
use crate::conflicts::data_parallel_only;

type Error = Box<dyn std::error::Error>;

/// The plan this run trains with; `None` when nothing is left to choose (data parallel on
/// devices of one kind, equal batches, no memory limit): nothing is profiled then.
pub fn choose(
    args: &Args,
    setup: &Setup,
    specs: &[DeviceSpec],
    devices: &[Device],
) -> Result<Option<Plan>, Error> {
    let n = devices.len();
    let names: Vec<String> = args
        .devices
        .split(',')
        .map(|d| d.trim().to_string())
        .collect();
    let dp_only = data_parallel_only(args);
    let request = if args.plan == PlanRequest::Auto && !dp_only.is_empty() {
        println!(
            "planner: comparing data-parallel plans only ({} need data parallelism)",
            dp_only.join(", ")
        );
        PlanRequest::DataParallel
    } else {
        args.plan.clone()
    };
    let threads = args
        .threads
        .unwrap_or_else(|| kiln::ddp::default_threads_per_replica(n));
    let planning = RunPlanning {
        model: format!(
            "resnet{} width {} cifar-stem 10 classes",
            args.model, args.width
        ),
        devices: names
            .iter()
            .cloned()
            .zip(specs.iter().cloned())
            .zip(devices.iter().cloned())
            .map(|((name, spec), device)| (name, spec, device))
            .collect(),
        global_batch: args.global_batch.unwrap_or(args.batch_size * n),
        request,
        fixed: Fixed {
            schedule: args.schedule,
            micro_batches: args.micro_batches,
        },
        memory: parse_memory_limits(args.device_memory.as_deref(), &names)?,
        threads,
        optimizer: "sgd momentum 0.9".into(),
        optimizer_state_factor: 1.0,
        profile_cache: args.profile_cache.clone(),
        predict: args.predict || args.save_plan.is_some(),
    };
    let planned = planning.choose(|device, key| {
        profile_model(args, setup, device, key, threads)
            .map_err(|err| PlanError::Request(format!("profiling: {err}")))
    })?;
    for note in &planned.notes {
        println!("{note}");
    }
    if let (Some(path), Some(plan)) = (&args.save_plan, &planned.plan) {
        std::fs::write(path, plan.to_json())
            .map_err(|err| format!("--save-plan {}: {err}", path.display()))?;
        println!("planner: plan saved to {}", path.display());
    }
    Ok(planned.plan)
}

/// Profiles the model at each of the key's batch sizes on `device`, before any loader runs
/// (the CPU's kept activations are read from the process heap).
fn profile_model(
    args: &Args,
    setup: &Setup,
    device: &Device,
    key: ProfileKey,
    threads: usize,
) -> Result<ModelProfile, Error> {
    let device = device.clone().autodiff();
    let device = if key.gradient_checkpointing {
        device.gradient_checkpointing()
    } else {
        device
    };
    let model: ResNet = crate::build_model(args, setup, &device);
    let largest = *key.batches.last().expect("at least one batch size");
    let batch = {
        let mut loader = DataLoader::builder(Arc::clone(&setup.train))
            .batch_size(largest)
            .transforms(setup.transforms.clone())
            .device(device.clone())
            .build();
        loader
            .epoch(0)
            .next()
            .ok_or("the training set is smaller than one batch")??
    };
    let batches = key
        .batches
        .iter()
        .enumerate()
        .map(|(i, &size)| -> Result<BatchProfile, Error> {
            // The first (smallest) size warms caches and pools up for the others.
            let options = ProfileOptions {
                threads: Some(threads),
                warmup: usize::from(i == 0),
                ..ProfileOptions::default()
            };
            let images = batch.images.clone().slice(0..size);
            let labels = batch.labels.clone().slice(0..size);
            Ok(profile_segments(&model, images, labels, &options)?)
        })
        .collect::<Result<_, _>>()?;
    // The optimizer the run trains with (see `main.rs`), updating once per step.
    let optimizer = crate::optimizer();
    let options = ProfileOptions {
        threads: Some(threads),
        ..ProfileOptions::default()
    };
    let smallest = key.batches[0];
    let update_seconds_per_byte = profile_update(
        &model,
        batch.images.clone().slice(0..smallest),
        batch.labels.clone().slice(0..smallest),
        optimizer,
        &options,
    )?;
    Ok(ModelProfile {
        key,
        batches,
        update_seconds_per_byte,
    })
}
