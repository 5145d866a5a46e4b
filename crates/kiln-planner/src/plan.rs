//! A chosen way to run the model: the serde type that prints as a table, saves as JSON and
//! loads back (`--plan plan.json`).

use std::fmt::Write as _;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::PlanError;

/// How the devices run the model, and what the planner predicts for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The model it was made for (the profile key's model).
    pub model: String,
    /// The devices, in `--devices` order.
    pub devices: Vec<String>,
    /// Samples per optimizer step, over all devices.
    pub global_batch: usize,
    /// The model's segments, in order (stages name runs of them).
    pub segment_names: Vec<String>,
    /// Replicas, stages, micro-batches.
    pub layout: Layout,
    /// What the cost model predicts.
    pub predicted: Predicted,
    /// Train with Burn's gradient checkpointing (`Device::gradient_checkpointing`): the
    /// memory lever the planner pulls when no plan fits without it; its prediction comes
    /// from a profile taken with it.
    #[serde(default)]
    pub gradient_checkpointing: bool,
}

/// Replicas or stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    /// One full replica per device; `batches[r]` samples on device `r`.
    DataParallel {
        /// Each replica's share of the global batch.
        batches: Vec<usize>,
    },
    /// `data_parallel` pipelines of `stages` stages (device `g·P + i` runs stage `i` of
    /// pipeline `g`), each batch of `global_batch / data_parallel` cut into `micro_batches`.
    Pipeline {
        /// Pipelines (D).
        data_parallel: usize,
        /// Stages per pipeline (P).
        stages: usize,
        /// `gpipe`, `1f1b`, `interleaved:V`.
        schedule: String,
        /// Micro-batches per batch (M).
        micro_batches: usize,
        /// Segments of each virtual stage, in model order.
        split: Vec<usize>,
        /// Each virtual stage's forward plus backward seconds per micro-batch.
        stage_seconds: Vec<f64>,
    },
}

/// The cost model's prediction for a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    /// Seconds per optimizer step.
    pub step_seconds: f64,
    /// Peak bytes on each device (parameters, gradients, optimizer state, activations);
    /// `None` where activations were not measured.
    pub device_bytes: Vec<Option<u64>>,
    /// Communication seconds per step not hidden behind computation.
    pub exposed_communication_seconds: f64,
    /// Fraction of the step a pipeline stage idles (0 for data parallel).
    pub bubble_fraction: f64,
}

impl Plan {
    /// `dp=2`, `pp=2 1f1b M=4`, `dp=2,pp=2 1f1b M=8`; `+ checkpointing` with the memory lever.
    pub fn summary(&self) -> String {
        let shape = match &self.layout {
            Layout::DataParallel { batches } => format!("dp={}", batches.len()),
            Layout::Pipeline {
                data_parallel,
                stages,
                schedule,
                micro_batches,
                ..
            } if *data_parallel == 1 => format!("pp={stages} {schedule} M={micro_batches}"),
            Layout::Pipeline {
                data_parallel,
                stages,
                schedule,
                micro_batches,
                ..
            } => format!("dp={data_parallel},pp={stages} {schedule} M={micro_batches}"),
        };
        if self.gradient_checkpointing {
            format!("{shape} + checkpointing")
        } else {
            shape
        }
    }

    /// Pipeline stages (1 for data parallel).
    pub fn stages(&self) -> usize {
        match &self.layout {
            Layout::DataParallel { .. } => 1,
            Layout::Pipeline { stages, .. } => *stages,
        }
    }

    /// Predicted samples per second.
    pub fn samples_per_second(&self) -> f64 {
        self.global_batch as f64 / self.predicted.step_seconds.max(1e-12)
    }

    /// The plan as a table: one row per replica or per stage.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let memory = |device: usize| match self.predicted.device_bytes.get(device) {
            Some(Some(bytes)) => crate::partition::human_bytes(*bytes),
            _ => "not measured".into(),
        };
        let _ = writeln!(
            out,
            "plan {} | global batch {} | predicted step {:.1} ms, {:.0} samples/s",
            self.summary(),
            self.global_batch,
            self.predicted.step_seconds * 1e3,
            self.samples_per_second()
        );
        match &self.layout {
            Layout::DataParallel { batches } => {
                let _ = writeln!(out, "  replica  device      batch  memory");
                for (r, batch) in batches.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "  {r:<7}  {:<10}  {batch:>5}  {}",
                        self.devices[r],
                        memory(r)
                    );
                }
                let _ = writeln!(
                    out,
                    "  exposed all-reduce {:.1} ms per step",
                    self.predicted.exposed_communication_seconds * 1e3
                );
            }
            Layout::Pipeline {
                data_parallel,
                stages,
                split,
                stage_seconds,
                ..
            } => {
                let _ = writeln!(
                    out,
                    "  stage  segments                 devices       ms/micro-batch  memory"
                );
                for (v, range) in ranges(split).into_iter().enumerate() {
                    let device = v % stages;
                    let names = format!(
                        "{}..{}",
                        self.segment_names[range.start],
                        self.segment_names[range.end - 1]
                    );
                    let devices = (0..*data_parallel)
                        .map(|g| self.devices[g * stages + device].as_str())
                        .collect::<Vec<_>>()
                        .join(",");
                    let _ = writeln!(
                        out,
                        "  {v:<5}  {names:<23}  {devices:<12}  {:>14.2}  {}",
                        stage_seconds[v] * 1e3,
                        memory(device)
                    );
                }
                let _ = writeln!(
                    out,
                    "  bubble {:.1}% | exposed all-reduce {:.1} ms per step",
                    100.0 * self.predicted.bubble_fraction,
                    self.predicted.exposed_communication_seconds * 1e3
                );
            }
        }
        out
    }

    /// The plan as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan serialises")
    }

    /// A plan from JSON, checked against the model and devices it is to run.
    ///
    /// # Errors
    /// [`PlanError::Mismatch`] for malformed JSON or a plan made for another model or
    /// device list.
    pub fn from_json(text: &str, model: &str, devices: &[String]) -> Result<Self, PlanError> {
        let plan: Plan = serde_json::from_str(text)
            .map_err(|err| PlanError::Mismatch(format!("not a kiln plan: {err}")))?;
        if plan.model != model {
            return Err(PlanError::Mismatch(format!(
                "the plan is for model `{}`, this run trains `{model}`",
                plan.model
            )));
        }
        if plan.devices != devices {
            return Err(PlanError::Mismatch(format!(
                "the plan is for devices {:?}, this run has {devices:?}",
                plan.devices
            )));
        }
        plan.check().map_err(PlanError::Mismatch)?;
        Ok(plan)
    }

    /// Whether the layout is one a run can take (a hand-edited file may not be).
    fn check(&self) -> Result<(), String> {
        let n = self.devices.len();
        if self.predicted.device_bytes.len() != n {
            return Err(format!(
                "{} predicted memories for {n} devices",
                self.predicted.device_bytes.len()
            ));
        }
        match &self.layout {
            Layout::DataParallel { batches } => {
                if batches.len() != n || batches.contains(&0) {
                    return Err(format!(
                        "data-parallel batches {batches:?}: one positive batch per device of {n}"
                    ));
                }
                if batches.iter().sum::<usize>() != self.global_batch {
                    return Err(format!(
                        "data-parallel batches {batches:?} do not add up to the global batch {}",
                        self.global_batch
                    ));
                }
            }
            Layout::Pipeline {
                data_parallel,
                stages,
                schedule,
                micro_batches,
                split,
                stage_seconds,
            } => {
                let kind: kiln_schedule::ScheduleKind =
                    schedule.parse().map_err(|err| format!("schedule: {err}"))?;
                if *data_parallel == 0 || *stages == 0 || data_parallel * stages != n {
                    return Err(format!(
                        "{data_parallel} pipelines of {stages} stages for {n} devices"
                    ));
                }
                if *micro_batches == 0 || !self.global_batch.is_multiple_of(*data_parallel) {
                    return Err(format!(
                        "{micro_batches} micro-batches, global batch {} over {data_parallel} pipelines",
                        self.global_batch
                    ));
                }
                let virtual_stages = stages * kind.chunks();
                if split.len() != virtual_stages
                    || split.contains(&0)
                    || split.iter().sum::<usize>() != self.segment_names.len()
                    || stage_seconds.len() != virtual_stages
                {
                    return Err(format!(
                        "split {split:?} must give each of {virtual_stages} virtual stages a segment and cover all {} (with a time each)",
                        self.segment_names.len()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Consecutive ranges of segments of the given lengths.
pub fn ranges(split: &[usize]) -> Vec<Range<usize>> {
    let mut start = 0;
    split
        .iter()
        .map(|&len| {
            start += len;
            start - len..start
        })
        .collect()
}

/// The planner's predicted step beside the measured one (the median step after the first,
/// which warms up), as a run prints it; `measured` is `None` when too few steps ran.
///
/// ```
/// assert_eq!(
///     kiln_planner::prediction_line(0.020, Some(0.025)),
///     "planner: predicted step 20.0 ms, measured 25.0 ms (+25%)"
/// );
/// assert!(kiln_planner::prediction_line(0.020, None).contains("nothing measured"));
/// ```
pub fn prediction_line(predicted_seconds: f64, measured_seconds: Option<f64>) -> String {
    let predicted = predicted_seconds * 1e3;
    match measured_seconds {
        Some(measured) => format!(
            "planner: predicted step {predicted:.1} ms, measured {:.1} ms ({:+.0}%)",
            measured * 1e3,
            100.0 * (measured / predicted_seconds - 1.0)
        ),
        None => format!(
            "planner: predicted step {predicted:.1} ms, nothing measured (the first step warms up and is not counted: train 2 steps or more to compare)"
        ),
    }
}
