//! What a pipeline run is asked to do, and its checks.

use std::time::Duration;

use kiln_amp::MixedPrecision;

use crate::runtime::PipelineError;
use crate::schedule::ScheduleKind;

/// Options of a pipeline run.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// The schedule: GPipe, 1F1B or interleaved 1F1B.
    pub schedule: ScheduleKind,
    /// Micro-batches each batch is cut into (M). A batch of B samples gives micro-batches of
    /// ⌈B/M⌉ and ⌊B/M⌋ samples (the larger first); gradients are weighted by each
    /// micro-batch's size, so the step is exactly the mean over the batch whatever the cut.
    pub micro_batches: usize,
    /// Segments of each virtual stage, in model order (`None`: as even as possible). With
    /// interleaving there are `stages × chunks` virtual stages: virtual stage `c·P + d` is
    /// chunk `c` of stage `d`.
    pub split: Option<Vec<usize>>,
    /// The longest a stage waits for a message before the run fails.
    pub timeout: Duration,
    /// Compute threads of each stage's own pool (`None`: the cores divided among stages).
    pub threads_per_stage: Option<usize>,
    /// Data-parallel pipelines (D): the devices form D pipelines of P stages (entries
    /// `g·P .. (g+1)·P` are pipeline `g`), each step takes D consecutive batches of the loader
    /// (one per pipeline), and the copies of each stage add their gradients before the
    /// optimizer step, which divides by the samples of all D batches.
    pub data_parallel: usize,
    /// Clip the step's mean gradient to this global norm, over every stage's parameters (after
    /// the data-parallel reduction), with PyTorch's `clip_grad_norm_` formula. `None`: no
    /// clipping.
    pub max_grad_norm: Option<f32>,
    /// Emulates slower devices on identical ones: stage `i` (of every pipeline) waits
    /// `emulated_slowdown[i] − 1` times each forward's and backward's compute time after it,
    /// as a device that many times slower would take, and counts the wait as compute. For
    /// benchmarks and tests of plans for heterogeneous devices; empty (the default): none.
    pub emulated_slowdown: Vec<f64>,
    /// Mixed precision (default f32): each stage computes on a working copy of its f32
    /// master parameters cast once per step, activations and their gradients cross stages
    /// in that precision, the loss runs in f32 on the last stage, and with a loss scaler
    /// (f16) the stages agree on whether a step's gradients are finite, so every stage (and
    /// every data-parallel copy) skips the same steps and keeps the same scale.
    pub precision: MixedPrecision,
    /// Gradient accumulation (k, default 1): each optimizer step takes k consecutive
    /// batches per pipeline and runs one schedule over all their k·M micro-batches (one
    /// flush, not k): 1F1B still holds at most P micro-batches' activations, and the
    /// bubble is paid once per step, not k times. Equal to one device accumulating the
    /// same k·M micro-batches.
    pub accumulation: usize,
    /// Every this many steps (0: never), the data-parallel copies of each stage compare
    /// their parameters bit for bit and fail with [`PipelineError::Diverged`] if they differ,
    /// and the stages' copies of a tied parameter theirs, failing with
    /// [`PipelineError::TiedDiverged`].
    pub check_every: usize,
    /// Stages train on Burn's gradient-checkpointing autodiff device: memory-bound
    /// activations are recomputed in backward instead of kept (the planner's memory lever).
    /// The loader's batches belong on [`PipelineConfig::train_device`] of the first stage's.
    pub gradient_checkpointing: bool,
    /// Fault injection, for testing what a failing stage does to a run (and a resume after
    /// it): the last stage panics when it takes this step (default `None`: never).
    pub panic_at_step: Option<usize>,
    /// The tied-weight tests' control: stages that share a tied parameter do not sum its
    /// gradients.
    #[cfg(test)]
    pub(crate) tied_sum_off: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            schedule: ScheduleKind::OneFOneB,
            micro_batches: 4,
            split: None,
            timeout: Duration::from_secs(300),
            threads_per_stage: None,
            data_parallel: 1,
            max_grad_norm: None,
            emulated_slowdown: Vec::new(),
            precision: MixedPrecision::f32(),
            accumulation: 1,
            check_every: 0,
            gradient_checkpointing: false,
            panic_at_step: None,
            #[cfg(test)]
            tied_sum_off: false,
        }
    }
}

impl PipelineConfig {
    /// The number of segments of each virtual stage, for a model of `segments` segments on
    /// `stages` stages.
    ///
    /// # Errors
    /// [`PipelineError::Config`] if there are more virtual stages than segments, or the
    /// given split does not cover the model with non-empty stages.
    pub fn segments_per_virtual_stage(
        &self,
        segments: usize,
        stages: usize,
    ) -> Result<Vec<usize>, PipelineError> {
        let virtual_stages = stages * self.schedule.chunks();
        if virtual_stages > segments {
            return Err(PipelineError::Config(format!(
                "{virtual_stages} virtual stages ({stages} stages x {} chunks) for a model of {segments} segments: every stage needs at least one segment",
                self.schedule.chunks()
            )));
        }
        match &self.split {
            None => Ok((0..virtual_stages)
                .map(|v| segments / virtual_stages + usize::from(v < segments % virtual_stages))
                .collect()),
            Some(split) => {
                if split.len() != virtual_stages {
                    return Err(PipelineError::Config(format!(
                        "the split names {} virtual stages, the schedule has {virtual_stages}",
                        split.len()
                    )));
                }
                if split.contains(&0) || split.iter().sum::<usize>() != segments {
                    return Err(PipelineError::Config(format!(
                        "the split {split:?} must give every virtual stage at least one segment and cover all {segments} segments"
                    )));
                }
                Ok(split.clone())
            }
        }
    }

    /// The training device of a stage on `device`: autodiff, with gradient checkpointing if
    /// asked for.
    pub fn train_device(&self, device: &burn::tensor::Device) -> burn::tensor::Device {
        let device = device.clone().autodiff();
        if self.gradient_checkpointing {
            device.gradient_checkpointing()
        } else {
            device
        }
    }

    /// Micro-batches of one step's schedule: M per batch, of `accumulation` batches.
    pub fn micro_batches_per_step(&self) -> usize {
        self.micro_batches * self.accumulation
    }

    /// Checks the options that do not depend on the model.
    pub(crate) fn validate(&self) -> Result<(), PipelineError> {
        if self.micro_batches == 0 {
            return Err(PipelineError::Config(
                "micro_batches must be at least 1".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(PipelineError::Config(
                "timeout must be longer than zero".into(),
            ));
        }
        if self.accumulation == 0 {
            return Err(PipelineError::Config(
                "accumulation must be at least 1 (batches per optimizer step)".into(),
            ));
        }
        if self.data_parallel == 0 {
            return Err(PipelineError::Config(
                "data_parallel must be at least 1 (one pipeline)".into(),
            ));
        }
        if let Some(norm) = self.max_grad_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            return Err(PipelineError::Config(format!(
                "max_grad_norm must be positive and finite, not {norm}"
            )));
        }
        if let Some(bad) = self
            .emulated_slowdown
            .iter()
            .find(|s| !(s.is_finite() && **s >= 1.0))
        {
            return Err(PipelineError::Config(format!(
                "emulated_slowdown must be at least 1 and finite, not {bad}"
            )));
        }
        if self.threads_per_stage == Some(0) {
            return Err(PipelineError::Config(
                "threads_per_stage must be at least 1 (None: the cores divided among stages)"
                    .into(),
            ));
        }
        Ok(())
    }
}
