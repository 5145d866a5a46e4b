//! The layout a run trains in: pipelines by hand (`--pipeline`) or as the planner's plan
//! says, or data parallel; and the measured step to set against the plan's prediction.

use kiln::pipeline::schedule::ScheduleKind;
use kiln::planner::{Layout, Plan, PlanRequest};

use crate::Args;

/// How pipelines train: by hand (`--pipeline`) or as the plan says.
pub struct Stages {
    pub data_parallel: usize,
    pub schedule: ScheduleKind,
    pub micro_batches: usize,
    /// Segments of each virtual stage (`None`: as even as possible).
    pub split: Option<Vec<usize>>,
    /// Burn's gradient checkpointing (the planner's memory lever).
    pub recompute: bool,
    /// The planner's step, in seconds.
    pub predicted: Option<f64>,
}

/// A layout: its description, the pipelines (`None`: data parallel on every device) and the
/// planner's predicted step in seconds.
pub type Chosen = (String, Option<Stages>, Option<f64>);

impl Stages {
    /// This layout of `stages` stages, described.
    pub fn described(self, stages: usize) -> Chosen {
        let predicted = self.predicted;
        let text = format!(
            "{} x {stages}-stage pipeline ({}, {} micro-batches{})",
            self.data_parallel,
            self.schedule,
            self.micro_batches,
            if self.recompute {
                ", recomputing activations"
            } else {
                ""
            }
        );
        (text, Some(self), predicted)
    }
}

/// What `--plan` asks the planner, checked against the options that need a plan's kind.
pub fn plan_request(args: &Args) -> Result<PlanRequest, String> {
    if args.pipeline.is_some() && args.plan != PlanRequest::Auto {
        return Err("--pipeline P is a plan by hand: leave out --plan (or use --plan pp=P)".into());
    }
    let pipelined = args.pipeline.is_some()
        || matches!(
            args.plan,
            PlanRequest::Pipeline(_) | PlanRequest::Hybrid { .. }
        );
    if args.zero1 && pipelined {
        return Err("--zero1 shards a data-parallel optimizer: a pipeline's stages each keep their own parameters' state already (leave out --zero1, or ask for --plan dp)".into());
    }
    if args.zero1 && args.plan == PlanRequest::Auto {
        println!("planner: comparing data-parallel plans only (--zero1 needs data parallelism)");
        return Ok(PlanRequest::DataParallel);
    }
    Ok(args.plan.clone())
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
            data_parallel,
            schedule: schedule
                .parse()
                .map_err(|err| format!("the plan's schedule `{schedule}`: {err}"))?,
            micro_batches,
            split: Some(split),
            recompute: plan.gradient_checkpointing,
            predicted,
        }
        .described(stages)),
    }
}
