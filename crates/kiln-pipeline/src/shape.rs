//! The shape of a pipelined run — stages per pipeline, schedule, micro-batches, split,
//! data-parallel pipelines, recomputation — given by hand or taken from the planner's plan.

use std::fmt;

use kiln_planner::{Layout, Plan};

use crate::{PipelineConfig, PipelineError, PipelineOptions};

/// Pipelines to train: `stages` stages each, in the shape `config` holds (the rest of a
/// [`PipelineConfig`] — precision, clipping, threads — is the run's own), and the planner's
/// predicted step when it chose them.
///
/// ```
/// use kiln_pipeline::{PipelineOptions, PipelineShape};
///
/// let options = PipelineOptions { pipeline: Some(2), data_parallel: 2, ..PipelineOptions::default() };
/// let shape = PipelineShape::by_hand(&options).expect("--pipeline was given");
/// assert_eq!(shape.devices(), 4);
/// assert!(shape.check_devices(3).unwrap_err().to_string().contains("needs 4 --devices entries"));
/// assert_eq!(shape.to_string(), "2 x 2-stage pipeline (1f1b, 4 micro-batches)");
/// ```
#[derive(Debug, Clone)]
pub struct PipelineShape {
    /// Stages per pipeline.
    pub stages: usize,
    /// The schedule, micro-batches, split, data-parallel pipelines and recomputation.
    pub config: PipelineConfig,
    /// The planner's step, in seconds (`None` by hand).
    pub predicted_step: Option<f64>,
}

impl PipelineShape {
    /// The pipelines given by hand (`--pipeline P` and the options beside it); `None`
    /// without `--pipeline`.
    pub fn by_hand(options: &PipelineOptions) -> Option<Self> {
        Some(Self {
            stages: options.pipeline?,
            config: options.config(PipelineConfig::default()),
            predicted_step: None,
        })
    }

    /// The pipelines of the planner's `plan`; `None` when it trains data parallel.
    ///
    /// # Errors
    /// [`PipelineError::Config`] when the plan's schedule is not one kiln knows (a plan file
    /// written by hand).
    pub fn planned(plan: &Plan) -> Result<Option<Self>, PipelineError> {
        let Layout::Pipeline {
            data_parallel,
            stages,
            schedule,
            micro_batches,
            split,
            ..
        } = &plan.layout
        else {
            return Ok(None);
        };
        let schedule = schedule.parse().map_err(|err| {
            PipelineError::Config(format!("the plan's schedule `{schedule}`: {err}"))
        })?;
        Ok(Some(Self {
            stages: *stages,
            config: PipelineConfig {
                data_parallel: *data_parallel,
                micro_batches: *micro_batches,
                schedule,
                split: Some(split.clone()),
                gradient_checkpointing: plan.gradient_checkpointing,
                ..PipelineConfig::default()
            },
            predicted_step: Some(plan.predicted.step_seconds),
        }))
    }

    /// Devices it takes: one per stage of each pipeline.
    pub fn devices(&self) -> usize {
        self.stages * self.config.data_parallel
    }

    /// Refuses `given` devices that are not one per stage of each pipeline.
    ///
    /// # Errors
    /// [`PipelineError::Config`] naming the count needed.
    pub fn check_devices(&self, given: usize) -> Result<(), PipelineError> {
        if given == self.devices() {
            return Ok(());
        }
        Err(PipelineError::Config(format!(
            "--pipeline {} --data-parallel {} needs {} --devices entries (one per stage of each pipeline), got {given}",
            self.stages,
            self.config.data_parallel,
            self.devices()
        )))
    }
}

impl fmt::Display for PipelineShape {
    /// `D x P-stage pipeline (schedule, M micro-batches[, recomputing activations])`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        write!(
            f,
            "{} x {}-stage pipeline ({}, {} micro-batches{})",
            config.data_parallel,
            self.stages,
            config.schedule,
            config.micro_batches,
            match config.gradient_checkpointing {
                true => ", recomputing activations",
                false => "",
            }
        )
    }
}
