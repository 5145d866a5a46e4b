//! What a data-parallel run prints when it ends besides each replica's line
//! (`kiln::ddp::outcome_lines`): the start-up, and the planner's prediction against the
//! measured step.

use std::time::{Duration, Instant};

use kiln::planner::{Layout, Plan};
use kiln::train::StartupCost;

use crate::args::Args;
use kiln::ddp::ReplicaOutcome;

use crate::Setup;

/// The start-up line and, for a planned data-parallel run, the predicted step against the
/// measured one.
pub(crate) fn print_timing(
    args: &Args,
    setup: &Setup,
    outcomes: &[ReplicaOutcome],
    process_start: Instant,
    planning: Duration,
    plan: Option<&Plan>,
) {
    // Each replica's batch: the plan's shares, else --batch-size (MPI: ranks over processes).
    let batches = setup.planned_batches.clone().unwrap_or_else(|| {
        vec![args.batch_size; outcomes.iter().map(|o| o.rank + 1).max().unwrap_or(0)]
    });
    // The median step after the first (which warms up), of the slowest replica: steps in
    // lockstep, validation and start-up not counted, as the prediction does not.
    let median_step = outcomes
        .iter()
        .filter_map(|o| {
            o.report
                .median_step_seconds(batches[o.rank] * args.step.accumulation)
        })
        .reduce(f64::max);
    let steady = median_step.map(Duration::from_secs_f64);
    let first_steps = outcomes.iter().filter_map(|o| o.report.first_step);
    if let Some(cost) = StartupCost::measure(process_start, planning, first_steps, steady) {
        println!("{cost}");
    }
    let Some(plan) = plan else { return };
    if !matches!(plan.layout, Layout::DataParallel { .. }) {
        return;
    }
    println!(
        "{}",
        kiln::planner::prediction_line(plan.predicted.step_seconds, median_step)
    );
}
