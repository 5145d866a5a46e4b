//! The pipeline options of a training command — stages by hand, micro-batches, the
//! schedule and its chart, the split, data-parallel pipelines — checked together and turned
//! into a [`PipelineConfig`]. With the `clap` feature they flatten into a command line:
//! `#[command(flatten)] pipeline: PipelineOptions`.

use kiln_schedule::{Costs, Schedule, ScheduleKind, simulate};

use crate::{PipelineConfig, PipelineError};

/// Micro-batches per batch of a pipeline given by hand without `--micro-batches`.
const DEFAULT_MICRO_BATCHES: usize = 4;

/// A pipeline's options (the field names are the flags' names).
///
/// ```
/// use kiln_pipeline::{PipelineConfig, PipelineOptions};
/// use kiln_pipeline::schedule::ScheduleKind;
///
/// let options = PipelineOptions { pipeline: Some(2), schedule: Some(ScheduleKind::GPipe), ..PipelineOptions::default() };
/// options.check()?;
/// let config = options.config(PipelineConfig::default());
/// assert_eq!((config.schedule, config.micro_batches), (ScheduleKind::GPipe, 4));
/// let split = PipelineOptions { split: Some(vec![3, 5]), ..PipelineOptions::default() };
/// assert!(split.check().unwrap_err().to_string().contains("need --pipeline"));
/// # Ok::<(), kiln_pipeline::PipelineError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct PipelineOptions {
    /// Pipeline parallelism by hand: cut the model into this many stages, one per --devices
    /// entry (CPU entries may repeat: stages are threads), instead of the planner's plan.
    #[cfg_attr(feature = "clap", arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub pipeline: Option<usize>,
    /// Micro-batches each batch is cut into, in a pipeline (default with --pipeline: 4; the
    /// planner compares P, 2P and 4P unless this fixes it).
    #[cfg_attr(feature = "clap", arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub micro_batches: Option<usize>,
    /// Pipeline schedule: gpipe, 1f1b, or interleaved[:V] (V chunks per stage, default 2).
    /// Default 1f1b; given with the planner, it fixes the schedule of any pipeline it plans.
    #[cfg_attr(feature = "clap", arg(long))]
    pub schedule: Option<ScheduleKind>,
    /// Print the pipeline schedule as a time x stage chart before training.
    #[cfg_attr(feature = "clap", arg(long))]
    pub show_schedule: bool,
    /// With --pipeline: segments per stage (per virtual stage with interleaving), in model
    /// order, e.g. `--split 4,6` (default: as even as possible by count).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub split: Option<Vec<usize>>,
    /// With --pipeline P: D data-parallel pipelines (--devices names D x P entries, pipeline
    /// after pipeline); each step takes D batches, and the copies of each stage add their
    /// gradients before the optimizer step.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub data_parallel: usize,
}

impl Default for PipelineOptions {
    /// No pipeline by hand, nothing fixed: one pipeline wherever the planner plans one.
    fn default() -> Self {
        Self {
            pipeline: None,
            micro_batches: None,
            schedule: None,
            show_schedule: false,
            split: None,
            data_parallel: 1,
        }
    }
}

impl PipelineOptions {
    /// Refuses the by-hand options without `--pipeline` (the planner chooses them) and
    /// counts of zero.
    ///
    /// # Errors
    /// [`PipelineError::Config`], naming the flags.
    pub fn check(&self) -> Result<(), PipelineError> {
        let refuse = |reason: &str| Err(PipelineError::Config(reason.into()));
        if self.pipeline == Some(0) || self.micro_batches == Some(0) || self.data_parallel == 0 {
            return refuse("--pipeline, --micro-batches and --data-parallel must be at least 1");
        }
        if self.pipeline.is_none() && (self.data_parallel != 1 || self.split.is_some()) {
            return refuse(
                "--data-parallel and --split need --pipeline (the planner chooses both: --plan dp=A,pp=B)",
            );
        }
        Ok(())
    }

    /// The pipeline choices given (`--micro-batches`, `--schedule`, `--show-schedule`): they
    /// describe a pipeline, planned or by hand, so a data-parallel run must refuse them.
    pub fn choices_given(&self) -> Vec<&'static str> {
        [
            (self.micro_batches.is_some(), "--micro-batches"),
            (self.schedule.is_some(), "--schedule"),
            (self.show_schedule, "--show-schedule"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }

    /// Refuses the pipeline choices in a run that is data parallel (`why` says what made it
    /// so, e.g. `--plan dp`): each would be ignored.
    ///
    /// # Errors
    /// [`PipelineError::Config`], naming the choices given.
    pub fn refuse_in_data_parallel(&self, why: &str) -> Result<(), PipelineError> {
        let choices = self.choices_given();
        if choices.is_empty() {
            return Ok(());
        }
        let verb = if choices.len() == 1 {
            "describes"
        } else {
            "describe"
        };
        Err(PipelineError::Config(format!(
            "{} {verb} a pipeline; this run is data parallel ({why})",
            choices.join(", ")
        )))
    }

    /// `base` with the pipeline given by hand written in: the schedule (1F1B unless given),
    /// micro-batches (4 unless given), the split and the data-parallel pipelines.
    pub fn config(&self, base: PipelineConfig) -> PipelineConfig {
        PipelineConfig {
            schedule: self.schedule.unwrap_or(ScheduleKind::OneFOneB),
            micro_batches: self.micro_batches.unwrap_or(DEFAULT_MICRO_BATCHES),
            split: self.split.clone(),
            data_parallel: self.data_parallel,
            ..base
        }
    }

    /// The choices given by hand that the planner keeps (`--schedule`, `--micro-batches`).
    pub fn fixed(&self) -> kiln_planner::Fixed {
        kiln_planner::Fixed {
            schedule: self.schedule,
            micro_batches: self.micro_batches,
        }
    }

    /// With `--show-schedule`, the chart of `config`'s schedule over `stages` stages (every
    /// accumulated micro-batch of a step; equal stages, backward twice a forward: the
    /// schedule's textbook shape).
    ///
    /// # Errors
    /// [`PipelineError::Schedule`] when the schedule cannot be built for this shape.
    pub fn chart(
        &self,
        config: &PipelineConfig,
        stages: usize,
    ) -> Result<Option<String>, PipelineError> {
        if !self.show_schedule {
            return Ok(None);
        }
        let schedule = Schedule::new(
            config.schedule,
            stages,
            config.micro_batches * config.accumulation,
        )?;
        let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0))?;
        Ok(Some(schedule.chart(&timeline)))
    }
}

impl PipelineConfig {
    /// `self` with a program's step options written in: precision, clipping, accumulation
    /// (batches per step, run as one schedule), the tied copies' agreement check and each
    /// stage's compute threads.
    pub fn with_steps(self, steps: &kiln_train::StepOptions) -> Self {
        PipelineConfig {
            threads_per_stage: steps.threads,
            max_grad_norm: steps.clip_grad_norm,
            precision: steps.precision(),
            accumulation: steps.accumulation,
            check_every: steps.check_every,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_by_hand_takes_its_defaults_and_the_given_choices() {
        let options = PipelineOptions {
            pipeline: Some(3),
            micro_batches: Some(6),
            schedule: Some(ScheduleKind::Interleaved { virtual_stages: 2 }),
            show_schedule: true,
            split: Some(vec![1, 2, 3, 4, 5, 6]),
            data_parallel: 2,
        };
        options.check().unwrap();
        let base = PipelineConfig {
            check_every: 5,
            ..PipelineConfig::default()
        };
        let config = options.config(base);
        assert_eq!(
            config.schedule,
            ScheduleKind::Interleaved { virtual_stages: 2 }
        );
        assert_eq!((config.micro_batches, config.data_parallel), (6, 2));
        assert_eq!(config.split, Some(vec![1, 2, 3, 4, 5, 6]));
        assert_eq!(config.check_every, 5, "the base's fields stay");
        assert_eq!(options.choices_given().len(), 3);
        let chart = options.chart(&config, 3).unwrap().expect("asked for");
        assert!(chart.lines().count() > 3, "{chart}");
        let plain = PipelineOptions {
            pipeline: Some(2),
            ..PipelineOptions::default()
        }
        .config(PipelineConfig::default());
        assert_eq!(
            (plain.schedule, plain.micro_batches),
            (ScheduleKind::OneFOneB, 4)
        );
        assert!(
            PipelineOptions::default()
                .chart(&plain, 2)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn by_hand_options_without_a_pipeline_and_zero_counts_are_refused() {
        for options in [
            PipelineOptions {
                data_parallel: 2,
                ..PipelineOptions::default()
            },
            PipelineOptions {
                split: Some(vec![2, 2]),
                ..PipelineOptions::default()
            },
        ] {
            let err = options.check().unwrap_err().to_string();
            assert!(err.contains("need --pipeline"), "{err}");
        }
        let zero = PipelineOptions {
            pipeline: Some(2),
            micro_batches: Some(0),
            ..PipelineOptions::default()
        };
        assert!(zero.check().is_err());
        let planned = PipelineOptions {
            schedule: Some(ScheduleKind::GPipe),
            ..PipelineOptions::default()
        };
        planned.check().expect("the planner takes a fixed schedule");
    }

    #[cfg(feature = "clap")]
    #[test]
    fn the_flags_parse_into_the_options() {
        use clap::Parser;
        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            pipeline: PipelineOptions,
        }
        let parsed = Command::try_parse_from([
            "x",
            "--pipeline",
            "2",
            "--schedule",
            "interleaved:3",
            "--split",
            "1,2,3,1,2,3",
        ])
        .unwrap()
        .pipeline;
        assert_eq!(parsed.pipeline, Some(2));
        assert_eq!(
            parsed.schedule,
            Some(ScheduleKind::Interleaved { virtual_stages: 3 })
        );
        assert_eq!(parsed.split, Some(vec![1, 2, 3, 1, 2, 3]));
        assert_eq!(parsed.data_parallel, 1);
        assert!(Command::try_parse_from(["x", "--split", "2,0"]).is_err());
    }
}
