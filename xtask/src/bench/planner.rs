//! The planner against measurement on this machine: predicted ÷ measured step time for every
//! plan of the example's default run (two CPU devices), whether the plan chosen is the
//! measured fastest, the planned stage split against an even one when one device is twice as
//! slow, and what planning ResNet-50 costs next to an epoch of training it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::tensor::{Device, Int, Tensor};
use kiln::data::DataLoader;
use kiln::ddp::DdpConfig;
use kiln::pipeline::schedule::ScheduleKind;
use kiln::pipeline::{Pipeline, PipelineConfig};
use kiln::planner::{
    BatchProfile, Fixed, Interconnect, Layout, ModelProfile, Plan, PlanDevice, PlanRequest,
    ProfileKey, ProfileOptions, Workload, choose_plan, measure_interconnect, profile_segments,
    profile_update,
};
use kiln::resnet::ResNet;
use kiln::train::LrSchedule;

use super::Output;
use super::throughput::{cores, train_resnet_replicas};
use super::workload::{BATCH, data, optimizer, resnet_of};
use crate::BenchArgs;
use crate::report::{Figure, Target};

const NAME: &str = "planner";
const DEVICES: usize = 2;
/// The example's default: 32 per device.
const GLOBAL_BATCH: usize = BATCH * DEVICES;
const WIDTH: usize = 8;

fn resnet(depth: usize, device: &Device) -> ResNet {
    resnet_of(device, depth, WIDTH)
}

/// Profiles ResNet-`depth` at the batch sizes the planner compares for `DEVICES` devices.
fn profile(depth: usize, threads: usize) -> Result<ModelProfile, Box<dyn std::error::Error>> {
    let device = Device::flex().autodiff();
    let model = resnet(depth, &device);
    let per_device = GLOBAL_BATCH / DEVICES;
    let batches = vec![per_device / 4, per_device];
    let images = Tensor::<4>::random(
        [per_device, 3, 32, 32],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &device,
    );
    let labels = Tensor::<1, Int>::from_data(
        burn::tensor::TensorData::new(
            (0..per_device as i64).map(|i| i % 10).collect(),
            [per_device],
        ),
        &device,
    );
    let profiles = batches
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            // The first (smallest) size warms caches and pools up for the others.
            let options = ProfileOptions {
                threads: Some(threads),
                warmup: usize::from(i == 0),
                ..ProfileOptions::default()
            };
            profile_segments(
                &model,
                images.clone().slice(0..b),
                labels.clone().slice(0..b),
                &options,
            )
        })
        .collect::<Result<Vec<BatchProfile>, _>>()?;
    let options = ProfileOptions {
        threads: Some(threads),
        ..ProfileOptions::default()
    };
    let smallest = batches[0];
    let update_seconds_per_byte = profile_update(
        &model,
        images.clone().slice(0..smallest),
        labels.clone().slice(0..smallest),
        optimizer(),
        &options,
    )?;
    Ok(ModelProfile {
        update_seconds_per_byte,
        key: ProfileKey {
            model: format!("resnet{depth} width {WIDTH}"),
            device: "cpu".into(),
            machine: kiln::core::cpu_name(),
            precision: "f32".into(),
            optimizer: "sgd momentum 0.9".into(),
            threads,
            batches,
            kiln: "bench".into(),
            gradient_checkpointing: false,
        },
        batches: profiles,
    })
}

fn plan_devices(slowdowns: &[f64]) -> Vec<PlanDevice> {
    slowdowns
        .iter()
        .enumerate()
        .map(|(i, &slowdown)| PlanDevice {
            name: format!("cpu:{i}"),
            slowdown,
            memory: None,
        })
        .collect()
}

fn forced(
    profile: &ModelProfile,
    devices: &[PlanDevice],
    net: &Interconnect,
    request: PlanRequest,
    micro_batches: Option<usize>,
) -> Result<Plan, Box<dyn std::error::Error>> {
    let workload = Workload {
        global_batch: GLOBAL_BATCH,
        optimizer_state_factor: 1.0,
    };
    let fixed = Fixed {
        schedule: None,
        micro_batches,
    };
    Ok(choose_plan(profile, devices, net, &workload, &request, fixed)?.chosen)
}

/// Measured seconds per step of `plan` (ResNet-`depth`), median over the measured steps.
fn measure(
    plan: &Plan,
    depth: usize,
    threads: usize,
    slowdown: &[f64],
    steps: (usize, usize),
) -> Result<f64, Box<dyn std::error::Error>> {
    let (warmup, measured) = steps;
    match &plan.layout {
        Layout::DataParallel { .. } => {
            let config = DdpConfig {
                threads_per_replica: Some(threads),
                ..DdpConfig::default()
            };
            let devices = vec![Device::flex(); DEVICES];
            let (step, _) = train_resnet_replicas(&devices, DEVICES, depth, WIDTH, config, steps)?;
            Ok(step.median)
        }
        Layout::Pipeline {
            schedule,
            micro_batches,
            split,
            ..
        } => pipeline_step(
            depth,
            threads,
            schedule.parse()?,
            *micro_batches,
            Some(split.clone()),
            slowdown,
            warmup + measured,
        ),
    }
}

/// Mean seconds per step (after the first) of a one-pipeline run over `DEVICES` stages.
fn pipeline_step(
    depth: usize,
    threads: usize,
    schedule: ScheduleKind,
    micro_batches: usize,
    split: Option<Vec<usize>>,
    slowdown: &[f64],
    steps: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut loader = DataLoader::builder(Arc::new(data(GLOBAL_BATCH * (steps + 1))))
        .batch_size(GLOBAL_BATCH)
        .num_workers(1)
        .device(Device::flex().autodiff())
        .build();
    let config = PipelineConfig {
        schedule,
        micro_batches,
        split,
        threads_per_stage: Some(threads),
        emulated_slowdown: slowdown.to_vec(),
        timeout: Duration::from_secs(300),
        ..PipelineConfig::default()
    };
    let report = Pipeline::new(vec![Device::flex(); DEVICES])
        .config(config)
        .train(
            |device: &Device| resnet(depth, device),
            optimizer,
            &LrSchedule::constant(0.05),
            &mut loader,
            steps,
        )?;
    Ok(report.step_time.as_secs_f64())
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let steps = if args.quick { (1, 3) } else { (3, 12) };
    let threads = (cores() / DEVICES).max(1);
    let devices = vec![Device::flex(); DEVICES];

    let profile18 = profile(18, threads)?;
    let net = measure_interconnect(DEVICES, &devices, 5)?;
    let equal = plan_devices(&[1.0; DEVICES]);
    out.figures
        .extend(default_run(&profile18, &equal, &net, threads, steps)?);
    out.figures
        .push(skewed_split(&profile18, &net, threads, steps)?);
    out.figures
        .extend(planning_cost(args.quick, threads, &devices, &equal)?);
    Ok(out)
}

/// Every plan of the example's default run, predicted and measured: how close each
/// prediction is, and whether the plan chosen is the measured fastest.
fn default_run(
    profile18: &ModelProfile,
    equal: &[PlanDevice],
    net: &Interconnect,
    threads: usize,
    steps: (usize, usize),
) -> Result<Vec<Figure>, Box<dyn std::error::Error>> {
    let candidates = candidates(profile18, equal, net)?;
    let chosen = forced(profile18, equal, net, PlanRequest::Auto, None)?;
    let mut figures = Vec::new();
    let mut measured_times = Vec::new();
    for plan in &candidates {
        let measured = measure(plan, 18, threads, &[], steps)?;
        measured_times.push((plan.summary(), measured));
        figures.extend(prediction_figures(plan, measured));
    }
    figures.push(chosen_against_fastest(&chosen, &measured_times)?);
    Ok(figures)
}

/// The plans the planner compares for the default run: data parallel, and one pipeline
/// over every device at each micro-batch count.
fn candidates(
    profile: &ModelProfile,
    equal: &[PlanDevice],
    net: &Interconnect,
) -> Result<Vec<Plan>, Box<dyn std::error::Error>> {
    let mut candidates = vec![forced(
        profile,
        equal,
        net,
        PlanRequest::DataParallel,
        None,
    )?];
    for m in [2, 4, 8] {
        candidates.push(forced(
            profile,
            equal,
            net,
            PlanRequest::Pipeline(DEVICES),
            Some(m),
        )?);
    }
    Ok(candidates)
}

/// `plan`'s measured and predicted step, and how far apart they are: the cost model is
/// held to within 15 %.
fn prediction_figures(plan: &Plan, measured: f64) -> [Figure; 3] {
    let predicted = plan.predicted.step_seconds;
    let label = |what: &str| format!("resnet18 w{WIDTH}, {}: {what}", plan.summary());
    [
        Figure::new(NAME, label("measured step"), measured * 1e3, "ms"),
        Figure::new(NAME, label("predicted step"), predicted * 1e3, "ms"),
        Figure::new(
            NAME,
            label("|predicted / measured − 1|"),
            (predicted / measured - 1.0).abs(),
            "fraction",
        )
        .target(Target::AtMost(0.15)),
    ]
}

/// The chosen plan's measured step ÷ the fastest measured one: the choice is judged by
/// measurement, and holds within 5 % of the best.
fn chosen_against_fastest(
    chosen: &Plan,
    measured_times: &[(String, f64)],
) -> Result<Figure, Box<dyn std::error::Error>> {
    let fastest = measured_times
        .iter()
        .map(|(_, t)| *t)
        .fold(f64::INFINITY, f64::min);
    let chosen_measured = measured_times
        .iter()
        .find(|(summary, _)| *summary == chosen.summary())
        .map(|(_, t)| *t)
        .ok_or("the chosen plan is among the measured ones")?;
    Ok(Figure::new(
        NAME,
        format!(
            "chosen plan ({}) measured ÷ fastest measured",
            chosen.summary()
        ),
        chosen_measured / fastest,
        "ratio",
    )
    .target(Target::AtMost(1.05)))
}

/// The first device twice as slow (emulated): the planned split against an even one (by
/// segment count, which hands the slow device the ResNet's expensive early blocks).
fn skewed_split(
    profile18: &ModelProfile,
    net: &Interconnect,
    threads: usize,
    steps: (usize, usize),
) -> Result<Figure, Box<dyn std::error::Error>> {
    let slowdown = [2.0, 1.0];
    let skewed = plan_devices(&slowdown);
    let planned = forced(
        profile18,
        &skewed,
        net,
        PlanRequest::Pipeline(DEVICES),
        Some(4),
    )?;
    let planned_step = measure(&planned, 18, threads, &slowdown, steps)?;
    let even_step = pipeline_step(
        18,
        threads,
        ScheduleKind::OneFOneB,
        4,
        None,
        &slowdown,
        steps.0 + steps.1,
    )?;
    let Layout::Pipeline { split, .. } = &planned.layout else {
        unreachable!("a pipeline was asked for")
    };
    Ok(Figure::new(
        NAME,
        format!("stage 0 2x slower: even split step ÷ planned split {split:?} step"),
        even_step / planned_step,
        "ratio",
    )
    .target(Target::AtLeast(1.3)))
}

/// What planning ResNet-50 costs against an epoch of the example's run with --model 50:
/// profiling and the search run before training starts, so they must stay small next to
/// it (at most a tenth of an epoch).
fn planning_cost(
    quick: bool,
    threads: usize,
    devices: &[Device],
    equal: &[PlanDevice],
) -> Result<[Figure; 2], Box<dyn std::error::Error>> {
    let start = Instant::now();
    let profile50 = profile(50, threads)?;
    let net50 = measure_interconnect(DEVICES, devices, 5)?;
    let plan50 = forced(&profile50, equal, &net50, PlanRequest::Auto, None)?;
    let planning = start.elapsed().as_secs_f64();
    let epoch_steps = 6_400 / GLOBAL_BATCH;
    let step50 = measure(&plan50, 50, threads, &[], (1, if quick { 2 } else { 4 }))?;
    Ok([
        Figure::new(
            NAME,
            "resnet50 w8: planning (profile + search)",
            planning,
            "s",
        ),
        Figure::new(
            NAME,
            format!(
                "resnet50 w8: planning ÷ one epoch ({epoch_steps} steps of {})",
                plan50.summary()
            ),
            planning / (step50 * epoch_steps as f64),
            "ratio",
        )
        .target(Target::AtMost(0.10)),
    ])
}
