//! `--plan`: profile the ResNet on the devices, predict the plans, print the choice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use burn::tensor::Device;
use kiln::core::DeviceSpec;
use kiln::data::DataLoader;
use kiln::planner::{
    BatchProfile, Fixed, Layout, ModelProfile, Plan, PlanDevice, PlanError, PlanRequest,
    ProfileCache, ProfileKey, ProfileOptions, TIE_MARGIN, Workload, choose_plan_with_lever,
    measure_interconnect, profile_segments, profile_update,
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
    let model_name = format!(
        "resnet{} width {} cifar-stem 10 classes",
        args.model, args.width
    );
    let global_batch = args.global_batch.unwrap_or(args.batch_size * n);
    if let PlanRequest::File(path) = &args.plan {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("--plan {}: {err}", path.display()))?;
        let plan = Plan::from_json(&text, &model_name, &names)
            .map_err(|err| format!("--plan {}: {err}", path.display()))?;
        if plan.global_batch != global_batch {
            return Err(format!(
                "--plan {}: the plan is for a global batch of {}, this run has {global_batch}",
                path.display(),
                plan.global_batch
            )
            .into());
        }
        if let Layout::Pipeline {
            schedule,
            micro_batches,
            ..
        } = &plan.layout
        {
            let schedule_differs = args.schedule.is_some_and(|s| s.to_string() != *schedule);
            if schedule_differs || args.micro_batches.is_some_and(|m| m != *micro_batches) {
                return Err(format!(
                    "--plan {}: the plan runs {schedule} with {micro_batches} micro-batches; --schedule and --micro-batches must agree with it or be left out",
                    path.display()
                )
                .into());
            }
        }
        println!("planner: loaded {}\n{}", path.display(), plan.table());
        return Ok(Some(plan));
    }
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
    let kinds = device_kinds(specs, devices);
    let data_parallel = request == PlanRequest::DataParallel || n == 1;
    if data_parallel
        && kinds.len() == 1
        && global_batch.is_multiple_of(n)
        && args.device_memory.is_none()
        && args.save_plan.is_none()
        && !args.predict
    {
        println!(
            "planner: data parallel on {n} device(s) of one kind, batches of {}: nothing to choose, nothing profiled (--predict profiles and predicts the step)",
            global_batch / n
        );
        return Ok(None);
    }
    let start = Instant::now();
    let threads = args
        .threads
        .unwrap_or_else(|| kiln::ddp::default_threads_per_replica(n));
    let per_replica = (global_batch / n).max(1);
    let mut batches = vec![(per_replica / 4).max(1), per_replica];
    batches.dedup();
    let mut profiles = BTreeMap::new();
    for (kind, device) in &kinds {
        let key = ProfileKey {
            model: model_name.clone(),
            device: kind.clone(),
            precision: "f32".into(),
            optimizer: "sgd momentum 0.9".into(),
            threads,
            batches: batches.clone(),
            kiln: env!("CARGO_PKG_VERSION").into(),
            gradient_checkpointing: false,
        };
        let cache = args.profile_cache.as_ref().map(ProfileCache::new);
        let cached = match &cache {
            Some(cache) => cache.load(&key)?,
            None => None,
        };
        let profile = match cached {
            Some(profile) => profile,
            None => {
                let profile = profile_model(args, setup, device, key, threads)?;
                if let Some(cache) = &cache {
                    cache.store(&profile)?;
                }
                profile
            }
        };
        profiles.insert(kind.clone(), profile);
    }
    // Slowdowns relative to the first device's kind; within the tie margin of it they are
    // equal, so that identical devices always get identical shares.
    let busy = |p: &ModelProfile| -> f64 {
        let last = p.batches.last().expect("profiled");
        last.segments
            .iter()
            .map(|s| s.forward_seconds + s.backward_seconds)
            .sum()
    };
    let reference = busy(&profiles[&kinds[0].0]);
    let memory = parse_memory(args.device_memory.as_deref(), &names)?;
    let plan_devices: Vec<PlanDevice> = specs
        .iter()
        .zip(&names)
        .zip(memory)
        .map(|((spec, name), memory)| {
            let ratio = busy(&profiles[&kind_name(spec)]) / reference;
            PlanDevice {
                name: name.clone(),
                slowdown: if (ratio - 1.0).abs() <= TIE_MARGIN {
                    1.0
                } else {
                    ratio
                },
                memory,
            }
        })
        .collect();
    let net = measure_interconnect(n, devices, 5)?;
    let workload = Workload {
        global_batch,
        optimizer_state_factor: 1.0,
    };
    let fixed = Fixed {
        schedule: args.schedule,
        micro_batches: args.micro_batches,
    };
    let profile = &profiles[&kinds[0].0];
    // The memory lever: where nothing fits, the model profiled again with Burn's gradient
    // checkpointing (activations recomputed in backward instead of kept).
    let recomputing = || {
        let (kind, device) = &kinds[0];
        println!("planner: no plan fits the memory limits; profiling with gradient checkpointing");
        let key = ProfileKey {
            gradient_checkpointing: true,
            ..profile.key.clone()
        };
        profile_model(args, setup, device, key, threads).map_err(|err| {
            PlanError::Request(format!(
                "profiling {kind} with gradient checkpointing: {err}"
            ))
        })
    };
    let choice = choose_plan_with_lever(
        profile,
        recomputing,
        &plan_devices,
        &net,
        &workload,
        &request,
        fixed,
    )?;
    if choice.chosen.gradient_checkpointing {
        println!(
            "planner: {} fits only with gradient checkpointing: Burn recomputes memory-bound activations (element-wise ops) in backward instead of keeping them, for more time per step",
            choice.chosen.summary()
        );
    }
    println!(
        "planner: profiled {} segments at batches {batches:?} on {} in {:.1} s, predicted {} plans",
        profile.segments(),
        kinds
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        start.elapsed().as_secs_f64(),
        choice.considered
    );
    print!("{}", choice.chosen.table());
    if let Some(other) = &choice.runner_up {
        println!(
            "  runner-up: {} at {:.1} ms per step",
            other.summary(),
            other.predicted.step_seconds * 1e3
        );
    }
    if let Some(path) = &args.save_plan {
        std::fs::write(path, choice.chosen.to_json())
            .map_err(|err| format!("--save-plan {}: {err}", path.display()))?;
        println!("planner: plan saved to {}", path.display());
    }
    Ok(Some(choice.chosen))
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

/// How the planner names a device's kind: every `cpu:N` is the one CPU backend.
fn kind_name(spec: &DeviceSpec) -> String {
    match spec {
        DeviceSpec::Cpu(_) => "cpu".into(),
        DeviceSpec::Cuda(index) => format!("cuda:{index}"),
        DeviceSpec::Wgpu => "wgpu".into(),
    }
}

/// Each distinct device kind, with the first device of that kind, in `--devices` order.
fn device_kinds(specs: &[DeviceSpec], devices: &[Device]) -> Vec<(String, Device)> {
    let mut kinds: Vec<(String, Device)> = Vec::new();
    for (spec, device) in specs.iter().zip(devices) {
        let name = kind_name(spec);
        if !kinds.iter().any(|(k, _)| *k == name) {
            kinds.push((name, device.clone()));
        }
    }
    kinds
}

/// `--device-memory`: one size for every device, or `name=size` per device.
fn parse_memory(text: Option<&str>, names: &[String]) -> Result<Vec<Option<u64>>, Error> {
    let Some(text) = text else {
        return Ok(vec![None; names.len()]);
    };
    if !text.contains('=') {
        let bytes = parse_size(text)?;
        return Ok(vec![Some(bytes); names.len()]);
    }
    let mut limits = vec![None; names.len()];
    for entry in text.split(',') {
        let (name, size) = entry
            .split_once('=')
            .ok_or_else(|| format!("--device-memory `{entry}`: expected DEVICE=SIZE"))?;
        let index = names.iter().position(|n| n == name.trim()).ok_or_else(|| {
            format!("--device-memory: `{name}` is not one of --devices {names:?}")
        })?;
        limits[index] = Some(parse_size(size)?);
    }
    Ok(limits)
}

/// `1.5GiB`, `512MB`, `4096` (bytes).
fn parse_size(text: &str) -> Result<u64, Error> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("--device-memory `{text}`: unknown unit `{other}`").into()),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("--device-memory `{text}`: not a size (e.g. 2GiB, 512MB)"))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("--device-memory `{text}`: must be positive").into());
    }
    Ok((value * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::{parse_memory, parse_size};

    #[test]
    fn memory_sizes_parse_and_nonsense_is_refused() {
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1.5kb").unwrap(), 1500);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "GiB", "2TiB", "-1GB", "0", "two"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let names = vec!["cpu:0".to_string(), "cpu:1".to_string()];
        assert_eq!(
            parse_memory(Some("cpu:1=1KiB"), &names).unwrap(),
            vec![None, Some(1024)]
        );
        assert_eq!(
            parse_memory(Some("1MB"), &names).unwrap(),
            vec![Some(1_000_000); 2]
        );
        assert!(parse_memory(Some("cuda:0=1GB"), &names).is_err());
        assert_eq!(parse_memory(None, &names).unwrap(), vec![None, None]);
    }
}
