//! Memory decides a transformer's plan: the `gpt` example's model in a 2-stage pipeline, each
//! stage's peak bytes as measured (`StageReport::peak_bytes`: what the stage's threads
//! allocated, counted by kiln's tracking allocator) against the planner's prediction for the
//! same plan (`predict_pipeline` on a profile of the model at the micro-batch size); GPipe
//! against 1F1B at the same micro-batch count; and Burn's gradient checkpointing
//! (recomputation): the memory it saves and the time it costs.
//!
//! The planner predicts a stage's peak as its state (parameters, autodiff's gradients, kiln's
//! flat gradient, AdamW's two moments) plus, per micro-batch in flight (1F1B: P − stage,
//! GPipe: M), the activations its segments keep from forward to backward. The measurement
//! adds what the prediction leaves out: backward's transient buffers, the kernels' scratch,
//! the micro-batch inputs, a sent activation until the next stage drops it.

use std::time::Duration;

use burn::tensor::Device;
use kiln::data::{Batch, BatchSource, TextCorpus, TextWindows};
use kiln::gpt::GptConfig;
use kiln::kernels::FusedAdamWConfig;
use kiln::pipeline::schedule::ScheduleKind;
use kiln::pipeline::{Pipeline, PipelineConfig, PipelineReport};
use kiln::planner::{
    BatchProfile, Interconnect, Layout, ModelProfile, PipelineShape, Plan, PlanDevice, ProfileKey,
    ProfileOptions, Workload, predict_pipeline, profile_segments_with,
};
use kiln::train::{LanguageModeling, LrSchedule};

use super::Output;
use super::gpt::{BATCH, CONTEXT, HEADS, LAYERS, SEED, WEIGHT_DECAY, WIDTH};
use super::throughput::cores;
use crate::BenchArgs;
use crate::report::{Figure, Target};

const NAME: &str = "gpt";
const STAGES: usize = 2;
const MICRO_BATCHES: usize = 8;

/// How the stages trained.
#[derive(Clone, Copy, PartialEq)]
struct Setting {
    kind: ScheduleKind,
    recompute: bool,
}

impl Setting {
    fn label(self) -> String {
        let recompute = if self.recompute {
            " + recomputation"
        } else {
            ""
        };
        format!("{STAGES} stages {} M={MICRO_BATCHES}{recompute}", self.kind)
    }
}

/// One pipeline run: each stage's measured peak, the planner's prediction, the step time.
struct Measured {
    peaks: Vec<u64>,
    predicted: Vec<u64>,
    step_seconds: f64,
}

fn config() -> GptConfig {
    GptConfig::new(256, CONTEXT, LAYERS, HEADS, WIDTH)
}

fn build(device: &Device) -> kiln::gpt::Gpt {
    kiln::core::init_on_host(device, SEED, |d| config().init(d))
}

fn optimizer() -> burn::optim::ModuleOptimizer {
    kiln::gpt::adamw(&FusedAdamWConfig::new().with_weight_decay(WEIGHT_DECAY))
}

fn windows(text: &TextCorpus, batch: usize, device: Device) -> Result<TextWindows, String> {
    TextWindows::builder(text.clone())
        .context(CONTEXT)
        .batch_size(batch)
        .seed(SEED)
        .device(device)
        .build()
        .map_err(|err| err.to_string())
}

/// The model profiled at the micro-batch size on a training device like the stages'.
fn profile(
    text: &TextCorpus,
    recompute: bool,
    threads: usize,
) -> Result<ModelProfile, Box<dyn std::error::Error>> {
    let micro = BATCH / MICRO_BATCHES;
    let device = Device::flex().autodiff();
    let device = if recompute {
        device.gradient_checkpointing()
    } else {
        device
    };
    let model = build(&device);
    let batch = windows(text, micro, device.clone())?
        .batches(0, 0)
        .next()
        .ok_or("the text is shorter than one batch")??;
    let options = ProfileOptions {
        threads: Some(threads),
        ..ProfileOptions::default()
    };
    let profiled: BatchProfile = profile_segments_with(
        &model,
        &LanguageModeling,
        &batch.slice(0..micro),
        &device,
        &options,
    )?;
    Ok(ModelProfile {
        key: ProfileKey {
            model: "gpt (bench)".into(),
            device: "cpu".into(),
            machine: kiln::core::cpu_name(),
            precision: "f32".into(),
            optimizer: "adamw".into(),
            threads,
            batches: vec![micro],
            kiln: env!("CARGO_PKG_VERSION").into(),
            gradient_checkpointing: recompute,
        },
        batches: vec![profiled],
        update_seconds_per_byte: 0.0,
    })
}

/// The planner's plan for `setting` on two unlimited CPU devices.
fn predict(profile: &ModelProfile, kind: ScheduleKind) -> Result<Plan, Box<dyn std::error::Error>> {
    let device = PlanDevice {
        name: "cpu".into(),
        slowdown: 1.0,
        memory: None,
    };
    let workload = Workload {
        global_batch: BATCH,
        optimizer_state_factor: 2.0,
    };
    let shape = PipelineShape {
        data_parallel: 1,
        stages: STAGES,
        micro_batches: MICRO_BATCHES,
        schedule: kind,
    };
    let net = Interconnect {
        all_reduce_latency: 0.0,
        all_reduce_seconds_per_byte: 0.0,
        transfer_seconds_per_byte: 0.0,
    };
    Ok(predict_pipeline(
        profile,
        &[device.clone(), device],
        &net,
        &workload,
        shape,
    )?)
}

/// Trains `steps` steps of `setting` with the plan's stage boundaries.
fn train(
    text: &TextCorpus,
    setting: Setting,
    plan: &Plan,
    (threads, steps): (usize, usize),
) -> Result<PipelineReport, Box<dyn std::error::Error>> {
    let Layout::Pipeline { split, .. } = &plan.layout else {
        return Err("the planner's prediction is not a pipeline".into());
    };
    let config = PipelineConfig {
        schedule: setting.kind,
        micro_batches: MICRO_BATCHES,
        split: Some(split.clone()),
        gradient_checkpointing: setting.recompute,
        threads_per_stage: Some(threads),
        timeout: Duration::from_secs(300),
        ..PipelineConfig::default()
    };
    let mut loader = windows(text, BATCH, config.train_device(&Device::flex()))?;
    Ok(
        Pipeline::with_objective(vec![Device::flex(); STAGES], LanguageModeling)
            .config(config)
            .train(
                build,
                optimizer,
                &LrSchedule::constant(1e-3),
                &mut loader,
                steps,
            )?,
    )
}

fn measure(
    text: &TextCorpus,
    setting: Setting,
    profile: &ModelProfile,
    run: (usize, usize),
) -> Result<Measured, Box<dyn std::error::Error>> {
    let plan = predict(profile, setting.kind)?;
    let report = train(text, setting, &plan, run)?;
    let peaks = report
        .stages
        .iter()
        .map(|stage| stage.peak_bytes)
        .collect::<Option<Vec<u64>>>()
        .ok_or("the stages' memory was not counted (the tracking allocator is not installed)")?;
    let predicted = plan.predicted.device_bytes[..STAGES]
        .iter()
        .copied()
        .collect::<Option<Vec<u64>>>()
        .ok_or("the profile has no activation sizes")?;
    Ok(Measured {
        peaks,
        predicted,
        step_seconds: report.step_time.as_secs_f64(),
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// Each stage's measured peak, the prediction, and how far apart they are.
fn stage_figures(out: &mut Output, setting: Setting, measured: &Measured) {
    for (stage, (&peak, &predicted)) in measured.peaks.iter().zip(&measured.predicted).enumerate() {
        let label = format!("memory: {}, stage {stage}", setting.label());
        out.figures.push(Figure::new(
            NAME,
            format!(
                "{label}: measured peak (planner predicts {:.1} MiB)",
                mib(predicted)
            ),
            mib(peak),
            "MiB",
        ));
        out.figures.push(
            Figure::new(
                NAME,
                format!("{label}: |measured / predicted − 1|"),
                (peak as f64 / predicted.max(1) as f64 - 1.0).abs(),
                "fraction",
            )
            .target(Target::AtMost(0.2)),
        );
    }
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let threads = (cores() / STAGES).max(1);
    let run = (threads, if args.quick { 2 } else { 6 });
    let (text, _) = TextCorpus::jargon_file().split(0.05)?;
    let plain = profile(&text, false, threads)?;
    let gpipe = Setting {
        kind: ScheduleKind::GPipe,
        recompute: false,
    };
    let one_f_one_b = Setting {
        kind: ScheduleKind::OneFOneB,
        recompute: false,
    };
    let recomputing = Setting {
        kind: ScheduleKind::OneFOneB,
        recompute: true,
    };
    let gpipe_run = measure(&text, gpipe, &plain, run)?;
    stage_figures(&mut out, gpipe, &gpipe_run);
    let ofob_run = measure(&text, one_f_one_b, &plain, run)?;
    stage_figures(&mut out, one_f_one_b, &ofob_run);
    let lever = profile(&text, true, threads)?;
    let recompute_run = measure(&text, recomputing, &lever, run)?;
    stage_figures(&mut out, recomputing, &recompute_run);
    // Stage 0 keeps the most micro-batches in flight: where the schedules differ most.
    let ratio = |a: &Measured, b: &Measured| a.peaks[0] as f64 / b.peaks[0].max(1) as f64;
    out.figures.push(Figure::new(
        NAME,
        format!(
            "memory: stage 0 peak, 1F1B / GPipe, M={MICRO_BATCHES} (predicted {:.2})",
            ofob_run.predicted[0] as f64 / gpipe_run.predicted[0].max(1) as f64
        ),
        ratio(&ofob_run, &gpipe_run),
        "ratio",
    ));
    out.figures.push(Figure::new(
        NAME,
        format!(
            "memory: recomputation's saving, stage 0 peak, 1F1B M={MICRO_BATCHES} (predicted {:.2})",
            1.0 - recompute_run.predicted[0] as f64 / ofob_run.predicted[0].max(1) as f64
        ),
        1.0 - ratio(&recompute_run, &ofob_run),
        "fraction",
    ));
    out.figures.push(Figure::new(
        NAME,
        format!("memory: recomputation's step time / without, 1F1B M={MICRO_BATCHES}"),
        recompute_run.step_seconds / ofob_run.step_seconds.max(1e-12),
        "ratio",
    ));
    Ok(out)
}
