//! The layout a run trains in: pipelines by hand (`--pipeline`) or as the planner's plan
//! says, or data parallel; and the measured step to set against the plan's prediction.

use kiln::pipeline::PipelineConfig;
use kiln::planner::{Layout, Plan, PlanRequest};

use crate::Args;

/// How pipelines train: by hand (`--pipeline`) or as the plan says.
pub struct Stages {
    /// Stages per pipeline.
    pub count: usize,
    /// The schedule, micro-batches, split, data-parallel pipelines and recomputation.
    pub shape: PipelineConfig,
    /// The planner's step, in seconds.
    pub predicted: Option<f64>,
}

/// A layout: its description, the pipelines (`None`: data parallel on every device) and the
/// planner's predicted step in seconds.
pub type Chosen = (String, Option<Stages>, Option<f64>);

impl Stages {
    /// This layout, described.
    pub fn described(self) -> Chosen {
        let (predicted, shape) = (self.predicted, &self.shape);
        let text = format!(
            "{} x {}-stage pipeline ({}, {} micro-batches{})",
            shape.data_parallel,
            self.count,
            shape.schedule,
            shape.micro_batches,
            if shape.gradient_checkpointing {
                ", recomputing activations"
            } else {
                ""
            }
        );
        (text, Some(self), predicted)
    }
}

/// What to ask the planner, with the options checked against the plan's kind: a pipeline by
/// hand takes none of the planner's, `--global-batch` is `--batch-size` here, `--zero1` needs
/// data parallelism, and the pipeline's choices need a pipeline.
pub fn plan_request(args: &Args) -> Result<PlanRequest, Box<dyn std::error::Error>> {
    args.pipeline.check()?;
    if args.planner.global_batch.is_some() {
        return Err("--global-batch: the gpt example's --batch-size is the global batch already (windows per step over every replica)".into());
    }
    if args.pipeline.pipeline.is_some() {
        args.planner.refuse_by_hand("--pipeline")?;
        if args.zero1 {
            return Err("--zero1 shards a data-parallel optimizer: a pipeline's stages each keep their own parameters' state already (leave out --zero1, or ask for --plan dp)".into());
        }
        return Ok(PlanRequest::Auto);
    }
    let zero1: &[&str] = if args.zero1 { &["--zero1"] } else { &[] };
    let (request, note) = args.planner.request(zero1, zero1)?;
    if let Some(note) = note {
        println!("{note}");
    }
    if request == PlanRequest::DataParallel {
        args.pipeline
            .refuse_in_data_parallel("--plan dp or --zero1")?;
    }
    Ok(request)
}

/// The layout of the planner's `plan` (`None`: data parallel on `devices` devices).
pub fn chosen(plan: Option<Plan>, devices: usize) -> Result<Chosen, String> {
    let Some(plan) = plan else {
        return Ok((format!("data parallel, {devices} replica(s)"), None, None));
    };
    let predicted = Some(plan.predicted.step_seconds);
    match plan.layout {
        Layout::DataParallel { batches } => {
            if batches.windows(2).any(|pair| pair[0] != pair[1]) {
                return Err(format!(
                    "the plan gives the replicas uneven batches {batches:?} (devices of different speeds): the gpt example shards text windows evenly; plan with --plan pp=N, or devices of one kind"
                ));
            }
            Ok((
                format!("data parallel, {devices} replica(s) (the planner's)"),
                None,
                predicted,
            ))
        }
        Layout::Pipeline {
            data_parallel,
            stages,
            schedule,
            micro_batches,
            split,
            ..
        } => Ok(Stages {
            count: stages,
            shape: PipelineConfig {
                data_parallel,
                schedule: schedule
                    .parse()
                    .map_err(|err| format!("the plan's schedule `{schedule}`: {err}"))?,
                micro_batches,
                split: Some(split),
                gradient_checkpointing: plan.gradient_checkpointing,
                ..PipelineConfig::default()
            },
            predicted,
        }
        .described()),
    }
}
