//! `--plan`: the planner profiles the GPT on the devices (once per kind, cached with
//! `--profile-cache`) and chooses data parallelism, pipeline stages or both for the memory
//! given (`--device-memory`); this file brings only the profile.

use burn::tensor::Device;
use kiln::core::DeviceSpec;
use kiln::data::{BatchSource, TextWindows};
use kiln::kernels::FusedAdamWConfig;
use kiln::planner::{ModelProfile, Plan, PlanError, PlanRequest, ProfileKey, RunPlanning};
use kiln::train::LanguageModeling;

use crate::{Args, Data};

/// The plan to train with (`None`: data parallel on every device, nothing left to choose).
pub fn choose(
    args: &Args,
    data: &Data,
    request: PlanRequest,
    devices: &[(String, DeviceSpec, Device)],
) -> Result<Option<Plan>, Box<dyn std::error::Error>> {
    let threads = (args.step.threads)
        .unwrap_or_else(|| kiln::ddp::default_threads_per_replica(devices.len()));
    let model = format!(
        "gpt bytes {} layers {} heads width {} context {}{}",
        args.layers,
        args.heads,
        args.width,
        args.context,
        if args.untied { " untied" } else { "" }
    );
    // AdamW keeps two moments per parameter.
    let planning = RunPlanning::new(model, devices.to_vec(), args.batch_size, request, threads)
        .fixed(args.pipeline.fixed())
        .optimizer("adamw", 2.0);
    let planning = args.planner.apply(planning)?;
    let planned = planning.choose(|device, key| profile(args, data, device, key, threads))?;
    for note in &planned.notes {
        println!("{note}");
    }
    Ok(planned.plan)
}

/// The GPT profiled on `device` at the key's batch sizes (windows), and AdamW's update.
fn profile(
    args: &Args,
    data: &Data,
    device: &Device,
    key: ProfileKey,
    threads: usize,
) -> Result<ModelProfile, PlanError> {
    let device = key.training_device(device);
    let model = data.build(args.seed, &device);
    let input = |why: String| PlanError::Request(format!("profiling the GPT: {why}"));
    let batch = TextWindows::builder(data.train.clone())
        .context(args.context)
        .batch_size(*key.batches.last().expect("at least one batch size"))
        .seed(args.seed)
        .device(device.clone())
        .build()
        .map_err(|err| input(err.to_string()))?
        .batches(0, 0)
        .next()
        .ok_or_else(|| input("the text is shorter than one batch".into()))?
        .map_err(|err| input(err.to_string()))?;
    let optimizer = kiln::gpt::adamw(&FusedAdamWConfig::new());
    let models = (&model, &LanguageModeling);
    kiln::planner::profile_model(key, models, &batch, &device, optimizer, threads)
}
