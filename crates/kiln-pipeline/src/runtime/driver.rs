//! The driver: takes batches from the loader, cuts them into micro-batches, hands every
//! stage of every data-parallel group its step and collects their reports.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use kiln_data::{DataLoader, ImageBatch};
use kiln_train::LrSchedule;

use crate::runtime::mailbox::Abort;
use crate::runtime::worker::{StepData, StepDone};
use crate::runtime::{PipelineConfig, PipelineError};

/// The driver's ends of the stages' channels: one step sender per stage thread, in
/// (group, stage) order.
pub(crate) struct ToStages<'a> {
    pub step_senders: &'a [Sender<StepData>],
    pub done: &'a Receiver<StepDone>,
    pub abort: &'a Abort,
    /// Stages per pipeline (P); `step_senders.len()` is D × P.
    pub stages: usize,
}

/// What the driver measured (times summed over the timed steps), per stage thread.
#[derive(Default)]
pub(crate) struct Driven {
    pub losses: Vec<f32>,
    pub forward: Vec<Vec<Duration>>,
    pub backward: Vec<Vec<Duration>>,
    pub peak: Vec<usize>,
    pub step_time: Duration,
}

/// Feeds the stages step after step and collects their reports. Each step takes one batch
/// per data-parallel group (consecutive batches of the loader).
pub(crate) fn drive(
    config: &PipelineConfig,
    schedule: &LrSchedule,
    loader: &mut DataLoader,
    steps: usize,
    to_stages: &ToStages<'_>,
) -> Result<Driven, PipelineError> {
    let &ToStages {
        step_senders,
        done,
        abort,
        stages,
    } = to_stages;
    let threads = step_senders.len();
    let groups = threads / stages.max(1);
    let mut driven = Driven {
        losses: Vec::with_capacity(steps),
        forward: vec![Vec::new(); threads],
        backward: vec![Vec::new(); threads],
        peak: vec![0; threads],
        step_time: Duration::ZERO,
    };
    let mut epoch = 0;
    let mut batches = loader.epoch(epoch);
    for step in 0..steps {
        let mut cuts = Vec::with_capacity(groups);
        for _ in 0..groups {
            let batch = match batches.next() {
                Some(batch) => batch?,
                None => {
                    epoch += 1;
                    batches = loader.epoch(epoch);
                    batches.next().ok_or_else(|| {
                        PipelineError::Config("the loader gives no batches".into())
                    })??
                }
            };
            cuts.push(cut(batch, config.micro_batches)?);
        }
        let samples: usize = cuts.iter().flatten().map(|b| b.indices.len()).sum();
        let start = Instant::now();
        for (thread, sender) in step_senders.iter().enumerate() {
            let data = StepData {
                lr: schedule.lr(step),
                micro_batches: cuts[thread / stages].clone(),
                samples,
            };
            if sender.send(data).is_err() {
                return Err(PipelineError::PeerLost {
                    stage: stages,
                    what: "a stage to take the step".into(),
                });
            }
        }
        let mut loss_sum = 0.0;
        for _ in 0..threads {
            let report = abort
                .recv(done, config.timeout)
                .map_err(|_| PipelineError::PeerLost {
                    stage: stages,
                    what: "a stage's step report".into(),
                })?;
            loss_sum += report.loss_sum;
            let thread = report.thread;
            if step > 0 || steps == 1 {
                add_into(&mut driven.forward[thread], &report.forward);
                add_into(&mut driven.backward[thread], &report.backward);
            }
            driven.peak[thread] = driven.peak[thread].max(report.peak_in_flight);
        }
        if step > 0 || steps == 1 {
            driven.step_time += start.elapsed();
        }
        let loss = (loss_sum / samples.max(1) as f64) as f32;
        if !loss.is_finite() {
            return Err(PipelineError::NonFiniteLoss { step, loss });
        }
        driven.losses.push(loss);
    }
    Ok(driven)
}

/// Adds `times` element-wise into `total` (which starts empty).
fn add_into(total: &mut Vec<Duration>, times: &[Duration]) {
    total.resize(times.len().max(total.len()), Duration::ZERO);
    total.iter_mut().zip(times).for_each(|(t, d)| *t += *d);
}

/// `batch` cut into `count` micro-batches along the batch dimension (sizes differ by at most
/// one, larger first).
fn cut(batch: ImageBatch, count: usize) -> Result<Vec<ImageBatch>, PipelineError> {
    let size = batch.indices.len();
    if size < count {
        return Err(PipelineError::Config(format!(
            "a batch of {size} samples cannot be cut into {count} micro-batches"
        )));
    }
    let mut start = 0;
    Ok((0..count)
        .map(|m| {
            let len = size / count + usize::from(m < size % count);
            let range = start..start + len;
            start += len;
            ImageBatch {
                images: batch.images.clone().slice([range.clone()]),
                labels: batch.labels.clone().slice([range.clone()]),
                indices: batch.indices[range].to_vec(),
            }
        })
        .collect())
}
