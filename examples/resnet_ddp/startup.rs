//! Start-up: the GPU runtime's settings from the options, what start-up cost, and the mark
//! that separates a kernel profile's warm-up from its steady state.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use kiln::core::gpu_runtime::GpuRuntime;
use kiln::train::{EpochSummary, StepRecord, TrainError, TrainObserver, TrainReport};

use crate::Outcome;
use crate::args::Args;

/// The GPU runtime's settings the options ask for.
pub fn gpu_runtime(args: &Args) -> GpuRuntime {
    GpuRuntime {
        cache: args.gpu_cache.clone(),
        autotune: args.autotune_level,
        kernel_profile: args.profile_kernels.clone(),
    }
}

/// The median of a replica's step times after its first step (`batch` samples a step).
pub fn median_step_seconds(report: &TrainReport, batch: usize) -> f64 {
    let mut seconds: Vec<f64> = report
        .steps
        .iter()
        .skip(1)
        .map(|step| batch as f64 / step.images_per_sec.max(1e-9))
        .collect();
    seconds.sort_by(f64::total_cmp);
    seconds.get(seconds.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What start-up cost: from the process's start to the first finished step (the last
/// replica's), the planner's share, and the first step beyond a steady one — on a GPU the
/// kernels' compilation and tuning (cubecl caches both on disk: a second run skips them).
pub fn startup_line(
    process_start: Instant,
    planning: std::time::Duration,
    outcomes: &[Outcome],
    median_step: f64,
) -> Option<String> {
    let first = outcomes
        .iter()
        .filter_map(|o| o.report.first_step)
        .max_by_key(|f| f.finished)?;
    let total = first.finished.duration_since(process_start).as_secs_f64();
    let took = first.took.as_secs_f64();
    let warmup = if median_step.is_finite() && median_step > 0.0 {
        format!(
            "{:.2} s beyond a median step of {:.1} ms (kernel compilation, tuning and first-touch allocation)",
            (took - median_step).max(0.0),
            median_step * 1e3
        )
    } else {
        "no later step to compare with".into()
    };
    Some(format!(
        "start-up: first step finished {total:.2} s after the process started | planner {:.2} s | first step {took:.2} s, {warmup} | setup {:.2} s",
        planning.as_secs_f64(),
        (total - took - planning.as_secs_f64()).max(0.0),
    ))
}

/// With --profile-kernels: after the warm-up steps, waits for the device to finish and for
/// cubecl's logger to write what it measured, then appends `kiln: steady state` to the
/// profile, so that its reader can leave the warm-up (compilation, tuning) out.
pub struct ProfileMark {
    file: PathBuf,
    after_steps: usize,
    device: burn::tensor::Device,
    seen: usize,
}

impl ProfileMark {
    /// Marks `file` once `after_steps` steps on `device` are done.
    pub fn new(file: PathBuf, after_steps: usize, device: burn::tensor::Device) -> Self {
        Self {
            file,
            after_steps,
            device,
            seen: 0,
        }
    }
}

impl TrainObserver for ProfileMark {
    fn on_step(&mut self, _: &StepRecord) -> Result<(), TrainError> {
        self.seen += 1;
        if self.seen != self.after_steps {
            return Ok(());
        }
        let failed = |why: String| {
            TrainError::Log(format!("--profile-kernels {}: {why}", self.file.display()))
        };
        self.device.sync().map_err(|err| failed(err.to_string()))?;
        // cubecl's logger resolves and writes each kernel's time on its own thread.
        std::thread::sleep(std::time::Duration::from_millis(500));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .map_err(|err| failed(err.to_string()))?;
        writeln!(file, "kiln: steady state after {} steps", self.seen)
            .map_err(|err| failed(err.to_string()))
    }

    fn on_epoch(&mut self, _: &EpochSummary) -> Result<(), TrainError> {
        Ok(())
    }
}

/// What to change when a device ran out of memory: the backends report it as a panic or an
/// error whose text names it (cubecl: "out of device memory"/`OutOfMemory`, Flex: the
/// allocator), which reaches here as a replica's or stage's failure.
pub fn out_of_memory_hint(error: &str, placement: &str) -> Option<String> {
    let lower = error.to_ascii_lowercase();
    let out_of_memory = [
        "out of memory",
        "out of device memory",
        "outofmemory",
        "memory allocation of",
    ]
    .iter()
    .any(|sign| lower.contains(sign));
    out_of_memory.then(|| {
        format!(
            "hint: a device ran out of memory ({placement}): lower --batch-size, train with --amp bf16, \
             or give the planner --device-memory SIZE so it picks a plan that fits (a pipeline, \
             gradient checkpointing)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::out_of_memory_hint;

    #[test]
    fn out_of_memory_gets_a_hint_and_other_errors_do_not() {
        let hint = out_of_memory_hint(
            "replica 0 panicked: Io(OutOfMemory { size: 123 })",
            "--devices cuda:0, batch 128 per replica",
        )
        .expect("a hint");
        assert!(
            hint.contains("cuda:0") && hint.contains("--batch-size"),
            "{hint}"
        );
        assert!(out_of_memory_hint("CUDA error: out of device memory", "x").is_some());
        assert!(out_of_memory_hint("replica 1 panicked: injected fault at step 10", "x").is_none());
    }
}
