//! What a pipeline run reports: per stage, and the run's; and the report assembled from the
//! driver's measurements and the trained stages (or the root cause of a failure).

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use kiln_amp::AmpStats;
use kiln_core::{Segmented, read_params};
use kiln_train::{EpochSummary, TrainPosition, TrainReport};

use crate::runtime::PipelineError;
use crate::runtime::engine::Driven;
use crate::runtime::stage::Stage;
use crate::schedule::{Costs, Schedule, simulate};

/// What one stage held and did.
#[derive(Debug, Clone, PartialEq)]
pub struct StageReport {
    /// Segment indices (in [`Segmented::segments`] order) of each of its chunks.
    pub segments: Vec<Range<usize>>,
    /// Bytes of the parameters and buffers the stage holds.
    pub param_bytes: usize,
    /// The most bytes its threads held at once over the steps (parameters, gradients,
    /// optimizer state, activations and scratch), counted by
    /// [`kiln_core::TrackingAllocator`] per stage (a [`kiln_core::MemoryAccount`]): a block
    /// counts for the stage that allocated it until it is released, so an activation sent
    /// to the next stage is the sender's. `None` on an accelerator (its own pool holds the
    /// tensors) or where the binary does not install the allocator.
    pub peak_bytes: Option<u64>,
    /// The most micro-batch activations (counting each chunk) it held at once.
    pub peak_in_flight: usize,
    /// Fraction of the step time it computed, averaged over steps after the first.
    pub busy_fraction: f64,
    /// Mean forward time of one micro-batch, per chunk (steps after the first).
    pub forward_time: Vec<Duration>,
    /// Mean backward time of one micro-batch, per chunk (steps after the first).
    pub backward_time: Vec<Duration>,
}

/// What a pipeline run did, and the trained parameters.
#[derive(Debug, Clone)]
pub struct PipelineReport {
    /// Mean loss of every step.
    pub losses: Vec<f32>,
    /// Per stage.
    pub stages: Vec<StageReport>,
    /// Mean step time after the first step.
    pub step_time: Duration,
    /// The step time the schedule predicts from the measured per-chunk forward and backward
    /// times (its simulation, bubble included, transfers and the optimizer step not): what
    /// `step_time` would be if the stages did nothing but compute and wait for each other
    /// (zero with stages in other processes: each reports its own).
    pub predicted_step_time: Duration,
    /// The trained trainable parameters, by path.
    pub params: HashMap<String, Vec<f32>>,
    /// Where a stop request ([`Pipeline::stop_flag`](crate::Pipeline::stop_flag)) ended the run, if one did (after a
    /// checkpoint, when the run has them).
    pub stopped_at: Option<TrainPosition>,
    /// Every epoch's summary (the last one partial when the step budget ends the run
    /// mid-epoch; none for an epoch a stop request cut short): training loss and accuracy,
    /// and validation through the pipeline with
    /// [`Pipeline::valid_loader`](crate::Pipeline::valid_loader).
    pub epochs: Vec<EpochSummary>,
    /// What mixed precision did ([`PipelineConfig::precision`](crate::PipelineConfig::precision)): steps, skipped steps and
    /// the loss scale, the same on every stage (they agree on every skip).
    pub amp: AmpStats,
}

impl PipelineReport {
    /// The measured bubble: the fraction of the step the stages were idle, averaged.
    pub fn bubble_fraction(&self) -> f64 {
        let stages = self.stages.len().max(1) as f64;
        1.0 - self.stages.iter().map(|s| s.busy_fraction).sum::<f64>() / stages
    }
}

/// The report, or the root cause of a failure (a stage's own error before the errors of
/// stages that only lost it).
///
/// `results` are this process's stage threads', `threads` their indices in (group, stage)
/// order over all processes; `helpers` the errors of the threads that serve them.
pub(crate) fn finish<M: Segmented>(
    driven: Result<(Driven, TrainReport), PipelineError>,
    results: Vec<Result<Stage<M>, PipelineError>>,
    helpers: Vec<PipelineError>,
    threads: &[usize],
    plan: &Schedule,
) -> Result<PipelineReport, PipelineError> {
    // What the stages' helper threads (couriers, links to other processes) failed with.
    let mut errors = helpers;
    let mut trained = Vec::with_capacity(results.len());
    for (result, &thread) in results.into_iter().zip(threads) {
        match result {
            Ok(stage) => trained.push((thread, stage)),
            Err(err) => errors.push(err),
        }
    }
    let (driven, run) = match driven {
        Ok(driven) if errors.is_empty() => driven,
        Ok(_) => Default::default(),
        Err(err) => {
            errors.push(err);
            Default::default()
        }
    };
    if !errors.is_empty() {
        let root = errors.iter().position(|e| !e.is_consequence()).unwrap_or(0);
        return Err(errors.swap_remove(root));
    }
    let steps_timed = driven.timed.steps.max(1);
    let step_time = driven.timed.step_time / steps_timed;
    // The data-parallel groups' stages mirror each other: report the first group's.
    trained.retain(|(thread, _)| *thread < plan.stages());
    let amp = trained
        .first()
        .map(|(_, stage)| stage.amp)
        .unwrap_or_default();
    let mut params = HashMap::new();
    let mut stages = Vec::with_capacity(trained.len());
    for (index, stage) in trained {
        let flat = read_params(&stage.model, stage.layout());
        for entry in stage.layout().entries() {
            let values = flat[entry.offset..entry.offset + entry.info.numel()].to_vec();
            params.insert(entry.info.path.clone(), values);
        }
        // Busy time: every forward and backward the stage ran.
        let busy: Duration = driven.timed.forward[index]
            .iter()
            .chain(&driven.timed.backward[index])
            .sum::<Duration>()
            / steps_timed;
        let per_micro_batch = |times: &[Duration]| -> Vec<Duration> {
            let count = steps_timed * plan.micro_batches() as u32;
            times.iter().map(|t| *t / count.max(1)).collect()
        };
        stages.push(StageReport {
            segments: stage.chunks().to_vec(),
            param_bytes: stage.param_bytes,
            peak_bytes: stage.peak_bytes,
            peak_in_flight: driven.peak[index],
            busy_fraction: busy.as_secs_f64() / step_time.as_secs_f64().max(1e-12),
            forward_time: per_micro_batch(&driven.timed.forward[index]),
            backward_time: per_micro_batch(&driven.timed.backward[index]),
        });
    }
    // With stages in other processes this one reports its own only: no whole prediction.
    let predicted_step_time = if stages.len() == plan.stages() {
        predicted_step_time(&stages, plan)
    } else {
        Duration::ZERO
    };
    Ok(PipelineReport {
        losses: run.losses(),
        stages,
        step_time,
        predicted_step_time,
        params,
        stopped_at: run.stopped_at,
        epochs: run.epochs,
        amp,
    })
}

/// The schedule's simulated step time with each virtual stage's measured compute times.
fn predicted_step_time(stages: &[StageReport], plan: &Schedule) -> Duration {
    let virtual_stages = plan.virtual_stages();
    let (mut forward, mut backward) = (vec![0.0; virtual_stages], vec![0.0; virtual_stages]);
    for (index, stage) in stages.iter().enumerate() {
        for (chunk, (f, b)) in stage
            .forward_time
            .iter()
            .zip(&stage.backward_time)
            .enumerate()
        {
            let v = plan.virtual_stage(index, chunk);
            forward[v] = f.as_secs_f64();
            backward[v] = b.as_secs_f64();
        }
    }
    let costs = Costs::per_virtual_stage(forward, backward);
    simulate(plan, &costs)
        .map(|timeline| Duration::from_secs_f64(timeline.step_time()))
        .unwrap_or_default()
}
