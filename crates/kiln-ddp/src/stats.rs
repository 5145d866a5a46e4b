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
