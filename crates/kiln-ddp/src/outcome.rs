//! What a replica's run ends with — its report, what it exchanged, what mixed precision did,
//! its parameters' fingerprint — and the lines a data-parallel run prints from every replica's.

use std::fmt::Write;
use std::sync::{Arc, Mutex};

use burn::module::Module;
use kiln_amp::{AmpStats, Precision};
use kiln_train::TrainReport;

use crate::{DdpStep, SyncStats};

/// One replica's run, summed up ([`StepWatch::finish`]).
#[derive(Debug, Clone)]
pub struct ReplicaOutcome {
    /// The replica's rank.
    pub rank: usize,
    /// The trainer's report.
    pub report: TrainReport,
    /// What it exchanged with its peers.
    pub sync: SyncStats,
    /// How its gradients travelled ([`DdpStep::transport`]).
    pub transport: &'static str,
    /// Mixed precision's statistics, when it trained in half precision.
    pub amp: Option<(Precision, AmpStats)>,
    /// Its trained parameters' fingerprint (`kiln_core::fingerprint`).
    pub fingerprint: u64,
}

/// Handles on a step's statistics, taken before the trainer owns the step.
#[derive(Debug)]
pub struct StepWatch {
    rank: usize,
    sync: Arc<Mutex<SyncStats>>,
    transport: &'static str,
    amp: Option<(Precision, Arc<Mutex<AmpStats>>)>,
}

impl<M: Module, O: kiln_train::Objective> DdpStep<M, O> {
    /// Handles on this step's statistics for replica `rank`, to read when training ends.
    pub fn watch(&self, rank: usize) -> StepWatch {
        let precision = self.precision();
        StepWatch {
            rank,
            sync: self.stats(),
            transport: self.transport(),
            amp: (precision != Precision::F32).then(|| (precision, self.amp_stats())),
        }
    }
}

impl StepWatch {
    /// The replica's outcome, once the trainer returned `report` and the trained `model`.
    pub fn finish<M: Module>(self, report: TrainReport, model: &M) -> ReplicaOutcome {
        ReplicaOutcome {
            rank: self.rank,
            report,
            sync: read(&self.sync),

            transport: self.transport,
            amp: self.amp.map(|(precision, stats)| (precision, read(&stats))),
            fingerprint: kiln_core::fingerprint(model),
        }
    }
}

/// A statistic's value now (a replica that panicked while holding it left it whole: each
/// update is one assignment).
fn read<T: Copy>(stats: &Mutex<T>) -> T {
    *stats.lock().unwrap_or_else(|p| p.into_inner())
}

/// One line per replica (images per second, synchronisation, ZeRO-1, AMP), rank 0's
/// parameter fingerprint, the replicas' total and where a stop request ended the run.
pub fn outcome_lines(outcomes: &[ReplicaOutcome]) -> String {
    let mut out = String::new();
    for outcome in outcomes {
        let report = &outcome.report;
        let rate = report.samples_trained() / report.training_seconds().max(1e-9);
        let sync = outcome.sync.summary(outcome.transport);
        let _ = write!(out, "replica {}: {rate:.0} img/s | {sync}", outcome.rank);
        if let Some((precision, amp)) = &outcome.amp {
            let _ = write!(
                out,
                " | AMP {precision}: loss scale {}, {} of {} steps skipped",
                amp.scale, amp.skipped, amp.steps
            );
        }
        out.push('\n');
        if outcome.rank == 0 {
            let _ = writeln!(
                out,
                "final parameters fingerprint: {:016x}",
                outcome.fingerprint
            );
        }
    }
    if outcomes.len() > 1 {
        // Replicas run side by side: all images over the slowest replica's time.
        let images: f64 = outcomes.iter().map(|o| o.report.samples_trained()).sum();
        let slowest = outcomes
            .iter()
            .map(|o| o.report.training_seconds())
            .fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "all {} replicas of this process: {:.0} img/s",
            outcomes.len(),
            images / slowest.max(1e-9)
        );
    }
    if let Some(stopped) = outcomes.iter().find_map(|o| o.report.stopped_at) {
        let _ = writeln!(
            out,
            "stopped at step {} by SIGTERM; continue with --resume latest",
            stopped.step
        );
    }
    out
}

/// The run's steady step in seconds: the median step after the first (which warms up) of
/// its slowest replica, for replica `rank`'s `samples(rank)` samples a step. Replicas step in
/// lockstep; validation and start-up are not counted (as a planner's prediction does not).
/// `None` with fewer than two steps.
pub fn steady_step_seconds(
    outcomes: &[ReplicaOutcome],
    samples: impl Fn(usize) -> usize,
) -> Option<f64> {
    (outcomes.iter())
        .filter_map(|o| o.report.median_step_seconds(samples(o.rank)))
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_step_is_the_slowest_replicas_median_after_the_first_step() {
        let stepped = |rank, rates: &[f64]| {
            let mut outcome = outcome(rank, 1.0);
            let record = kiln_train::testing::step_at;
            outcome.report.steps = rates.iter().map(|&r| record(r)).collect();
            outcome
        };
        // 10 samples a step: replica 1's median of 20, 5 and 10 img/s after its first is 1 s.
        let outcomes = [
            stepped(0, &[1.0, 20.0, 20.0, 20.0]),
            stepped(1, &[1.0, 20.0, 5.0, 10.0]),
        ];
        assert_eq!(steady_step_seconds(&outcomes, |_| 10), Some(1.0));
        assert_eq!(steady_step_seconds(&[stepped(0, &[1.0])], |_| 10), None);
    }

    fn outcome(rank: usize, seconds: f64) -> ReplicaOutcome {
        let mut report = TrainReport::default();
        report.epochs.push(kiln_train::EpochSummary {
            epoch: 0,
            train_loss: 1.0,
            train_accuracy: 0.5,
            valid_loss: None,
            valid_accuracy: None,
            images_per_sec: 100.0,
            elapsed: std::time::Duration::from_secs_f64(seconds),
            data_wait: std::time::Duration::ZERO,
        });
        ReplicaOutcome {
            rank,
            report,
            sync: SyncStats::default(),
            transport: "host buffer",
            amp: (rank == 1).then_some({
                (
                    Precision::Bf16,
                    AmpStats {
                        steps: 4,
                        skipped: 1,
                        scale: 1.0,
                    },
                )
            }),
            fingerprint: 0xabc,
        }
    }

    #[test]
    fn the_lines_name_each_replica_rank_0s_fingerprint_and_the_slowest_replicas_total() {
        let lines = outcome_lines(&[outcome(0, 1.0), outcome(1, 2.0)]);
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(
            lines[0].starts_with("replica 0: 100 img/s | sync: nothing"),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1], "final parameters fingerprint: 0000000000000abc");
        assert!(
            lines[2].ends_with("AMP bf16: loss scale 1, 1 of 4 steps skipped"),
            "{}",
            lines[2]
        );
        // 100 + 200 images over the slower replica's 2 s.
        assert_eq!(lines[3], "all 2 replicas of this process: 150 img/s");
    }
}
