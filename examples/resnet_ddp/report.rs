//! What a data-parallel run prints when it ends: each replica's throughput and
//! synchronisation, the process's total, the start-up, and the planner's prediction against
//! the measured step.

use std::time::{Duration, Instant};

use kiln::planner::{Layout, Plan};
use kiln::train::StartupCost;

use crate::args::Args;
use crate::{Outcome, Setup};

/// One line per replica (images per second, synchronisation, ZeRO-1, AMP), rank 0's
/// parameter fingerprint, the process's total and where SIGTERM stopped the run.
pub(crate) fn print_replicas(args: &Args, outcomes: &[Outcome]) {
    for outcome in outcomes {
        let report = &outcome.report;
        let rate = report.samples_trained() / report.training_seconds().max(1e-9);
        let mut line = format!(
            "replica {}: {rate:.0} img/s | {}",
            outcome.rank,
            outcome.sync.summary(outcome.transport)
        );
        if let Some(amp) = &outcome.amp {
            line += &format!(
                " | AMP {}: loss scale {}, {} of {} steps skipped",
                args.amp.precision(),
                amp.scale,
                amp.skipped,
                amp.steps
            );
        }
        println!("{line}");
        if outcome.rank == 0 {
            println!("final parameters fingerprint: {:016x}", outcome.fingerprint);
        }
    }
    if outcomes.len() > 1 {
        // Replicas run side by side: all images over the slowest replica's time.
        let images: f64 = outcomes.iter().map(|o| o.report.samples_trained()).sum();
        let slowest = outcomes
            .iter()
            .map(|o| o.report.training_seconds())
            .fold(0.0, f64::max);
        println!(
            "all {} replicas of this process: {:.0} img/s",
            outcomes.len(),
            images / slowest.max(1e-9)
        );
    }
    if let Some(stopped) = outcomes.iter().find_map(|o| o.report.stopped_at) {
        println!(
            "stopped at step {} by SIGTERM; continue with --resume latest",
            stopped.step
        );
    }
}

/// The start-up line and, for a planned data-parallel run, the predicted step against the
/// measured one.
pub(crate) fn print_timing(
    args: &Args,
    setup: &Setup,
    outcomes: &[Outcome],
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
                .median_step_seconds(batches[o.rank] * args.accumulation)
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
    let predicted = plan.predicted.step_seconds;
    if let Some(measured) = median_step {
        println!(
            "planner: predicted step {:.1} ms, measured {:.1} ms ({:+.0}%)",
            predicted * 1e3,
            measured * 1e3,
            100.0 * (measured / predicted - 1.0)
        );
    } else {
        println!(
            "planner: predicted step {:.1} ms, nothing measured (the first step warms up and is not counted: train 2 steps or more to compare)",
            predicted * 1e3
        );
    }
}
