//! Bucketing: as backward completes parameter groups, the buckets they make ready start
//! their all-reduce, in plan order.

use crate::grads::GradStore;
use crate::pass::GroupSink;
use crate::plan::BucketPlan;
use crate::reduce::{InFlight, Wire};

/// Starts each bucket of `plan` once the group that completes it is done.
pub(crate) struct Bucketing<'a> {
    plan: &'a BucketPlan,
    wire: Wire<'a>,
    samples: usize,
    in_flight: Vec<InFlight>,
    /// Buckets started while backward still had groups to run.
    during_backward: usize,
}

impl<'a> Bucketing<'a> {
    /// Buckets of `plan` carrying this replica's `samples` over `wire`.
    pub(crate) fn new(plan: &'a BucketPlan, wire: Wire<'a>, samples: usize) -> Self {
        Self {
            plan,
            wire,
            samples,
            in_flight: Vec::with_capacity(plan.buckets().len()),
            during_backward: 0,
        }
    }

    /// Buckets whose all-reduce started before backward's last group was done: what can
    /// overlap backward, whatever the timing.
    pub(crate) fn during_backward(&self) -> usize {
        self.during_backward
    }

    /// The buckets started so far, in plan order.
    pub(crate) fn into_in_flight(self) -> Vec<InFlight> {
        self.in_flight
    }
}

impl GroupSink for Bucketing<'_> {
    fn group_done(&mut self, group: usize, store: &GradStore) {
        let ready = self.plan.ready_after_group(group);
        let started = self.in_flight.len();
        for bucket in &self.plan.buckets()[started..ready] {
            let flight =
                store.start_reduce(self.plan.layout(), bucket.clone(), self.samples, self.wire);
            self.in_flight.push(flight);
        }
        if group + 1 < self.plan.groups() {
            self.during_backward += self.in_flight.len() - started;
        }
    }
}

/// Ignores completed groups (micro-batches before the last, and steps that do not reduce).
pub(crate) struct NoBuckets;

impl GroupSink for NoBuckets {
    fn group_done(&mut self, _group: usize, _store: &GradStore) {}
}
