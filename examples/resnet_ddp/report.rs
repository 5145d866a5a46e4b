//! What a data-parallel run prints when it ends: each replica's throughput and
//! synchronisation, the process's total, the start-up, and the planner's prediction against
//! the measured step.

use std::time::{Duration, Instant};

use kiln::planner::{Layout, Plan};

use crate::args::Args;
use crate::{Outcome, Setup, startup};

/// One line per replica (images per second, synchronisation, ZeRO-1, AMP), rank 0's
/// parameter fingerprint, the process's total and where SIGTERM stopped the run.
pub(crate) fn print_replicas(args: &Args, outcomes: &[Outcome]) {
    let mut global_images = 0.0;
    let mut slowest_secs: f64 = 0.0;
    for outcome in outcomes {
        let report = &outcome.report;
        let images: f64 = report
            .epochs
            .iter()
            .map(|e| e.images_per_sec * e.elapsed.as_secs_f64())
            .sum();
        let secs: f64 = report.epochs.iter().map(|e| e.elapsed.as_secs_f64()).sum();
        global_images += images;
        slowest_secs = slowest_secs.max(secs);
        let mut line = format!(
            "replica {}: {:.0} img/s",
            outcome.rank,
            images / secs.max(1e-9)
        );
        line += &sync_summary(outcome);
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
        println!(
            "all {} replicas of this process: {:.0} img/s",
            outcomes.len(),
            global_images / slowest_secs.max(1e-9)
        );
    }
    if let Some(stopped) = outcomes.iter().find_map(|o| o.report.stopped_at) {
        println!(
            "stopped at step {} by SIGTERM; continue with --resume latest",
            stopped.step
        );
    }
}

/// A replica's gradient synchronisation, as its line's ` | sync ...` part.
fn sync_summary(outcome: &Outcome) -> String {
    if outcome.sync.buckets == 0 {
        return " | sync: nothing to exchange (one replica)".to_string();
    }
    let stats = &outcome.sync;
    let mut line = format!(
        " | sync ({}): {:.1} MB/step in {} buckets, exposed {:.1}% of compute",
        outcome.transport,
        stats.bytes as f64 / stats.steps.max(1) as f64 / 1e6,
        stats.buckets / stats.steps.max(1),
        100.0 * stats.overhead(),
    );
    if stats.communication.is_zero() && outcome.transport.contains("native") {
        // NCCL runs on its own stream; only the wait for it is timed on the host.
        line += ", reduction time not measured on the native path";
    } else {
        line += &format!(
            ", {:.0}% of communication hidden",
            100.0 * stats.hidden_fraction()
        );
    }
    if let Some((owned, total)) = stats.optimizer_shard {
        line += &format!(
            " | ZeRO-1: optimizer state for {owned} of {total} parameters ({:.0}% saved)",
            100.0 * (1.0 - owned as f64 / total as f64)
        );
    }
    line
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
        .map(|outcome| {
            startup::median_step_seconds(&outcome.report, batches[outcome.rank] * args.accumulation)
        })
        .fold(0.0, f64::max);
    if let Some(line) = startup::startup_line(process_start, planning, outcomes, median_step) {
        println!("{line}");
    }
    let Some(plan) = plan else { return };
    if !matches!(plan.layout, Layout::DataParallel { .. }) {
        return;
    }
    let predicted = plan.predicted.step_seconds;
    let measured = median_step;
    if measured.is_finite() && measured > 0.0 {
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
