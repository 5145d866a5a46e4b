//! What start-up cost a run: from the process's start to its first finished step, split into
//! planning, set-up and the first step's excess over a steady one (on a GPU: the kernels'
//! compilation and tuning, which cubecl caches on disk for the next run).

use std::fmt;
use std::time::{Duration, Instant};

use crate::FirstStep;

/// Where a run's time went before its first finished step; [`Display`](fmt::Display) gives
/// the one line the examples print.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StartupCost {
    /// From the process's start to the first finished step.
    pub to_first_step: Duration,
    /// Of it, the planner's (profiling included).
    pub planning: Duration,
    /// Of it, the first step itself.
    pub first_step: Duration,
    /// A steady step (the median after the first), when more than one step ran.
    pub steady_step: Option<Duration>,
}

impl StartupCost {
    /// The cost of a run whose replicas (or stages) finished their first steps at `first_steps`
    /// (the last one counts: training starts when every replica has), `None` when none ran.
    pub fn measure(
        process_start: Instant,
        planning: Duration,
        first_steps: impl IntoIterator<Item = FirstStep>,
        steady_step: Option<Duration>,
    ) -> Option<Self> {
        let last = first_steps.into_iter().max_by_key(|f| f.finished)?;
        Some(Self {
            to_first_step: last.finished.saturating_duration_since(process_start),
            planning,
            first_step: last.took,
            steady_step,
        })
    }

    /// What was neither planning nor the first step: loading data, building and placing the
    /// model, starting the replicas.
    pub fn setup(&self) -> Duration {
        self.to_first_step
            .saturating_sub(self.first_step)
            .saturating_sub(self.planning)
    }

    /// The first step's time beyond a steady step's (compilation, tuning, first-touch
    /// allocation), when a steady step was measured.
    pub fn warmup(&self) -> Option<Duration> {
        self.steady_step
            .map(|steady| self.first_step.saturating_sub(steady))
    }
}

impl fmt::Display for StartupCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let warmup = match (self.warmup(), self.steady_step) {
            (Some(warmup), Some(steady)) => format!(
                "{:.2} s beyond a median step of {:.1} ms (kernel compilation, tuning and first-touch allocation)",
                warmup.as_secs_f64(),
                steady.as_secs_f64() * 1e3
            ),
            _ => "no later step to compare with".into(),
        };
        write!(
            f,
            "start-up: first step finished {:.2} s after the process started | planner {:.2} s | first step {:.2} s, {warmup} | setup {:.2} s",
            self.to_first_step.as_secs_f64(),
            self.planning.as_secs_f64(),
            self.first_step.as_secs_f64(),
            self.setup().as_secs_f64(),
        )
    }
}

/// Whether a failure's text says a device ran out of memory. The backends report it as a
/// panic or an error whose text names it (cubecl: "out of device memory" or `OutOfMemory`,
/// the system allocator: "memory allocation of N bytes failed"), which reaches the caller
/// as a replica's or a stage's failure.
pub fn is_out_of_memory(error: &str) -> bool {
    let lower = error.to_ascii_lowercase();
    [
        "out of memory",
        "out of device memory",
        "outofmemory",
        "memory allocation of",
    ]
    .iter()
    .any(|sign| lower.contains(sign))
}

/// What to change when a device ran out of memory, if `error`'s text says one did
/// ([`is_out_of_memory`]): `placement` says where the run was (devices and batch), and the
/// hint names the usual options of a kiln program (`--batch-size`, `--amp`, and the planner's
/// `--device-memory`).
pub fn out_of_memory_hint(error: &str, placement: &str) -> Option<String> {
    is_out_of_memory(error).then(|| {
        format!(
            "hint: a device ran out of memory ({placement}): lower --batch-size, train with --amp bf16, \
             or give the planner --device-memory SIZE so it picks a plan that fits (a pipeline, \
             gradient checkpointing)"
        )
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{StartupCost, is_out_of_memory, out_of_memory_hint};
    use crate::FirstStep;

    #[test]
    fn the_last_first_step_counts_and_the_parts_add_up() {
        let start = Instant::now();
        let at = |secs: f64, took: f64| FirstStep {
            finished: start + Duration::from_secs_f64(secs),
            took: Duration::from_secs_f64(took),
        };
        let cost = StartupCost::measure(
            start,
            Duration::from_secs(2),
            [at(5.0, 1.5), at(7.0, 3.0)],
            Some(Duration::from_millis(500)),
        )
        .expect("steps ran");
        assert_eq!(cost.to_first_step, Duration::from_secs(7));
        assert_eq!(cost.setup(), Duration::from_secs(2));
        assert_eq!(cost.warmup(), Some(Duration::from_millis(2500)));
        let line = cost.to_string();
        assert!(
            line.contains("7.00 s after")
                && line.contains("2.50 s beyond a median step of 500.0 ms"),
            "{line}"
        );
        assert_eq!(StartupCost::measure(start, Duration::ZERO, [], None), None);
        let once = StartupCost::measure(start, Duration::ZERO, [at(1.0, 1.0)], None).unwrap();
        assert!(once.to_string().contains("no later step"), "{once}");
    }

    #[test]
    fn out_of_memory_is_recognised_and_other_failures_are_not() {
        assert!(is_out_of_memory(
            "replica 0 panicked: Io(OutOfMemory { size: 123 })"
        ));
        assert!(is_out_of_memory("CUDA error: out of device memory"));
        assert!(is_out_of_memory("memory allocation of 1024 bytes failed"));
        assert!(!is_out_of_memory(
            "replica 1 panicked: injected fault at step 10"
        ));
    }

    #[test]
    fn out_of_memory_gets_a_hint_naming_the_placement_and_the_flags() {
        let hint = out_of_memory_hint(
            "replica 0 panicked: Io(OutOfMemory { size: 123 })",
            "--devices cuda:0, batch 128 per replica",
        )
        .expect("a hint");
        assert!(
            hint.contains("cuda:0") && hint.contains("--batch-size"),
            "{hint}"
        );
        assert!(out_of_memory_hint("replica 1 panicked: injected fault at step 10", "x").is_none());
    }
}
