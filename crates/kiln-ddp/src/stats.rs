//! What a data-parallel step measures about its synchronisation.

use std::time::Duration;

/// How much of the gradient communication the step hid behind backward.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncStats {
    /// Optimizer steps measured.
    pub steps: usize,
    /// Time spent computing forward and backward.
    pub compute: Duration,
    /// Time the communication thread spent all-reducing gradients.
    pub communication: Duration,
    /// Time the step waited for communication after its backward had finished.
    pub exposed: Duration,
    /// Buckets all-reduced.
    pub buckets: usize,
    /// Buckets whose all-reduce started while backward still had segments to run: the
    /// overlap's opportunity, fixed by the model and the bucket plan (how much of the
    /// communication it hid is [`SyncStats::hidden_fraction`], a matter of timing).
    pub buckets_during_backward: usize,
    /// Bytes sent into all-reduce (per replica).
    pub bytes: usize,
    /// With ZeRO-1: (parameters whose optimizer state this replica keeps, all parameters).
    pub optimizer_shard: Option<(usize, usize)>,
}

impl SyncStats {
    /// Fraction of communication time that overlapped computation (1 = fully hidden).
    pub fn hidden_fraction(&self) -> f64 {
        if self.communication.is_zero() {
            return 1.0;
        }
        (1.0 - self.exposed.as_secs_f64() / self.communication.as_secs_f64()).clamp(0.0, 1.0)
    }

    /// Exposed synchronisation as a fraction of compute time.
    pub fn overhead(&self) -> f64 {
        self.exposed.as_secs_f64() / self.compute.as_secs_f64().max(1e-12)
    }
}

impl SyncStats {
    /// One line of what the replica exchanged, its gradients having travelled by
    /// `transport` (the step's [`transport`](crate::DdpStep::transport)): bytes and buckets
    /// a step, the exposed share of compute, how much of the communication was hidden, and
    /// ZeRO-1's saving; "nothing to exchange" for a replica without peers.
    pub fn summary(&self, transport: &str) -> String {
        if self.buckets == 0 {
            return "sync: nothing to exchange (one replica)".to_string();
        }
        let steps = self.steps.max(1);
        let mut line = format!(
            "sync ({transport}): {:.1} MB/step in {} buckets, exposed {:.1}% of compute",
            self.bytes as f64 / steps as f64 / 1e6,
            self.buckets / steps,
            100.0 * self.overhead(),
        );
        if self.communication.is_zero() && transport.contains("native") {
            // NCCL runs on its own stream; only the wait for it is timed on the host.
            line += ", reduction time not measured on the native path";
        } else {
            line += &format!(
                ", {:.0}% of communication hidden",
                100.0 * self.hidden_fraction()
            );
        }
        if let Some((owned, total)) = self.optimizer_shard {
            line += &format!(
                " | ZeRO-1: optimizer state for {owned} of {total} parameters ({:.0}% saved)",
                100.0 * (1.0 - owned as f64 / total.max(1) as f64)
            );
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::SyncStats;

    #[test]
    fn the_summary_says_what_was_exchanged_or_that_nothing_was() {
        assert_eq!(
            SyncStats::default().summary("host"),
            "sync: nothing to exchange (one replica)"
        );
        let stats = SyncStats {
            steps: 2,
            compute: Duration::from_secs(1),
            communication: Duration::from_millis(400),
            exposed: Duration::from_millis(100),
            buckets: 8,
            buckets_during_backward: 6,
            bytes: 4_000_000,
            optimizer_shard: Some((25, 100)),
        };
        assert_eq!(
            stats.summary("host"),
            "sync (host): 2.0 MB/step in 4 buckets, exposed 10.0% of compute, 75% of communication hidden | ZeRO-1: optimizer state for 25 of 100 parameters (75% saved)"
        );
        let native = SyncStats {
            communication: Duration::ZERO,
            optimizer_shard: None,
            ..stats
        };
        assert!(
            native
                .summary("native (nccl)")
                .ends_with("not measured on the native path")
        );
    }
}
