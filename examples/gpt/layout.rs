//! The layout a run trains in: pipelines by hand (`--pipeline`) or as the planner's plan
//! says, or data parallel; and the measured step to set against the plan's prediction.

use kiln::pipeline::PipelineShape;
use kiln::planner::{Layout, Plan, PlanRequest};

use crate::Args;

/// A layout: its description, the pipelines (`None`: data parallel on every device) and the
/// planner's predicted step in seconds.
pub type Chosen = (String, Option<PipelineShape>, Option<f64>);

/// The pipelines given by hand, described.
pub fn by_hand(shape: PipelineShape) -> Chosen {
    (shape.to_string(), Some(shape), None)
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
pub fn chosen(plan: Option<Plan>, devices: usize) -> Result<Chosen, Box<dyn std::error::Error>> {
    let Some(plan) = plan else {
        return Ok((format!("data parallel, {devices} replica(s)"), None, None));
    };
    let predicted = Some(plan.predicted.step_seconds);
    if let Some(shape) = PipelineShape::planned(&plan)? {
        return Ok((shape.to_string(), Some(shape), predicted));
    }
    if let Layout::DataParallel { batches } = &plan.layout
        && batches.windows(2).any(|pair| pair[0] != pair[1])
    {
        return Err(format!(
            "the plan gives the replicas uneven batches {batches:?} (devices of different speeds): the gpt example shards text windows evenly; plan with --plan pp=N, or devices of one kind"
        ).into());
    }
    let text = format!("data parallel, {devices} replica(s) (the planner's)");
    Ok((text, None, predicted))
}
