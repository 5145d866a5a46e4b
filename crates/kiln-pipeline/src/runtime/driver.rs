//! The driver: takes batches from the source (a loader, or any `BatchSource`), cuts them
//! into micro-batches, hands every stage of every data-parallel group its step and collects
//! their reports.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use kiln_checkpoint::Checkpointer;
use kiln_comm::Communicator;
use kiln_data::{Batch, BatchSource, cut_batch};
use kiln_train::{EpochSummary, LrSchedule, StepRecord, StopFlag, TrainObserver, TrainPosition};

use crate::runtime::checkpoint::Writes;
use crate::runtime::mailbox::Abort;
use crate::runtime::worker::{StepData, StepDone};
use crate::runtime::{PipelineConfig, PipelineError};

/// The driver's ends of the stages' channels: one step sender per stage thread of this
/// process, in (group, stage) order.
pub(crate) struct ToStages<'a, B> {
    pub step_senders: &'a [Sender<StepData<B>>],
    /// The thread (in (group, stage) order over all processes) each sender feeds.
    pub threads: &'a [usize],
    /// Stage threads over all processes (D × P).
    pub total: usize,
    /// With stages in other processes: the world, over which each step's loss sums and
    /// every stop is agreed.
    pub across: Option<&'a Communicator>,
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
    /// Where a stop request ended the run.
    pub stopped_at: Option<TrainPosition>,
    /// Every whole epoch's summary (validation included, with a validation loader).
    pub epochs: Vec<EpochSummary>,
}

/// Where the run starts and ends, and what goes on around its steps.
pub(crate) struct Around<'a, 'w, B> {
    /// Where it starts (a resumed run: the checkpoint's position).
    pub start: TrainPosition,
    /// The step it ends at.
    pub steps: usize,
    /// Checkpoints, and the writes under way.
    pub checkpoints: Option<(&'a Checkpointer, &'a mut Writes<'w>)>,
    pub stop: Option<&'a StopFlag>,
    pub observer: Option<&'a mut dyn TrainObserver>,
    /// Validation data, run through the first pipeline after every epoch.
    pub valid: Option<&'a mut (dyn BatchSource<Batch = B> + Send)>,
    /// Print every epoch's summary.
    pub log_epochs: bool,
}

/// One epoch's running sums, for its summary.
#[derive(Default)]
struct EpochSums {
    loss: f64,
    correct: usize,
    samples: usize,
    elapsed: Duration,
    data_wait: Duration,
}

/// Feeds the stages step after step and collects their reports. Each step takes one batch
/// per data-parallel group (consecutive batches of the loader); an epoch is the loader's
/// batches ÷ the groups, whole steps only.
pub(crate) fn drive<S: BatchSource + ?Sized>(
    config: &PipelineConfig,
    schedule: &LrSchedule,
    loader: &mut S,
    around: Around<'_, '_, S::Batch>,
    to_stages: &ToStages<'_, S::Batch>,
) -> Result<Driven, PipelineError> {
    let &ToStages {
        step_senders,
        threads: local,
        total: threads,
        done,
        abort,
        stages,
        across,
    } = to_stages;
    let Around {
        start,
        steps,
        mut checkpoints,
        stop,
        mut observer,
        mut valid,
        log_epochs,
    } = around;
    let groups = threads / stages.max(1);
    // Batches one step takes: `accumulation` for each pipeline.
    let per_step = groups * config.accumulation;
    let per_epoch = loader.num_batches() / per_step;
    if per_epoch == 0 {
        return Err(PipelineError::Config(format!(
            "the loader gives {} batches per epoch, fewer than one step takes ({groups} pipelines x {} accumulated)",
            loader.num_batches(),
            config.accumulation
        )));
    }
    if start.step_in_epoch >= per_epoch {
        return Err(PipelineError::Checkpoint(format!(
            "resuming at step {} of epoch {}, which has only {per_epoch} steps (another batch size or data set?)",
            start.step_in_epoch, start.epoch
        )));
    }
    let mut driven = Driven {
        losses: Vec::with_capacity(steps.saturating_sub(start.step)),
        forward: vec![Vec::new(); threads],
        backward: vec![Vec::new(); threads],
        peak: vec![0; threads],
        ..Driven::default()
    };
    let mut position = start;
    let mut sums = EpochSums::default();
    let mut batches = loader.batches(position.epoch as u64, position.step_in_epoch * per_step);
    let first = start.step;
    while position.step < steps {
        let step = position.step;
        let waiting = Instant::now();
        // Each pipeline's micro-batches: those of its `accumulation` consecutive batches.
        let mut cuts = Vec::with_capacity(groups);
        for _ in 0..groups {
            let mut micro_batches = Vec::with_capacity(config.micro_batches_per_step());
            for _ in 0..config.accumulation {
                let batch = batches.next().ok_or_else(|| {
                    PipelineError::Config("the loader's epoch ended before its last step".into())
                })??;
                micro_batches.extend(cut(&batch, config.micro_batches)?);
            }
            cuts.push(micro_batches);
        }
        let data_wait = waiting.elapsed();
        let finished = step + 1 == steps;
        let stopping = agree_to_stop(across, stop.is_some_and(StopFlag::is_requested))?;
        let mut next = TrainPosition {
            step: step + 1,
            epoch: position.epoch,
            step_in_epoch: position.step_in_epoch + 1,
        };
        if next.step_in_epoch == per_epoch {
            next.epoch += 1;
            next.step_in_epoch = 0;
        }
        let save = checkpoints
            .as_ref()
            .is_some_and(|(c, _)| c.is_due(&next, finished || stopping));
        let check = config.check_every > 0 && next.step.is_multiple_of(config.check_every);
        let samples: usize = cuts.iter().flatten().map(Batch::samples).sum();
        let lr = schedule.lr(step);
        let began = Instant::now();
        for (&thread, sender) in local.iter().zip(step_senders) {
            let data = StepData {
                lr,
                micro_batches: cuts[thread / stages].clone(),
                samples,
                step,
                save,
                check,
                panic: config.panic_at_step == Some(step),
                evaluate: false,
            };
            if sender.send(data).is_err() {
                return Err(PipelineError::PeerLost {
                    stage: stages,
                    what: "a stage to take the step".into(),
                });
            }
        }
        let (mut loss_sum, mut correct) = (0.0, 0);
        for _ in 0..local.len() {
            let report = abort
                .recv(done, config.timeout)
                .map_err(|_| PipelineError::PeerLost {
                    stage: stages,
                    what: "a stage's step report".into(),
                })?;
            loss_sum += report.loss_sum;
            correct += report.correct;
            let thread = report.thread;
            if step > first || steps == first + 1 {
                add_into(&mut driven.forward[thread], &report.forward);
                add_into(&mut driven.backward[thread], &report.backward);
            }
            driven.peak[thread] = driven.peak[thread].max(report.peak_in_flight);
        }
        // Stages in other processes: the loss is the last stage's, wherever it runs.
        (loss_sum, correct) = sum_across(across, loss_sum, correct)?;
        let took = began.elapsed();
        if step > first || steps == first + 1 {
            driven.step_time += took;
        }
        let loss = (loss_sum / samples.max(1) as f64) as f32;
        if !loss.is_finite() {
            return Err(PipelineError::NonFiniteLoss { step, loss });
        }
        driven.losses.push(loss);
        sums.loss += loss_sum;
        sums.correct += correct;
        sums.samples += samples;
        sums.elapsed += took;
        sums.data_wait += data_wait;
        if let Some(observer) = observer.as_deref_mut() {
            observer
                .on_step(&StepRecord {
                    epoch: position.epoch,
                    step,
                    loss,
                    accuracy: correct as f32 / samples.max(1) as f32,
                    lr,
                    images_per_sec: samples as f64 / took.as_secs_f64().max(1e-9),
                    data_wait,
                    loss_scale: None,
                })
                .map_err(|err| PipelineError::Observer(err.to_string()))?;
        }
        if next.epoch > position.epoch {
            let sums = std::mem::take(&mut sums);
            let validation = match valid.as_deref_mut() {
                Some(valid) => Some(validate(config, valid, to_stages)?),
                None => None,
            };
            let summary = EpochSummary {
                epoch: position.epoch,
                train_loss: (sums.loss / sums.samples.max(1) as f64) as f32,
                train_accuracy: sums.correct as f32 / sums.samples.max(1) as f32,
                valid_loss: validation.map(|(loss, _)| loss),
                valid_accuracy: validation.map(|(_, accuracy)| accuracy),
                images_per_sec: sums.samples as f64 / sums.elapsed.as_secs_f64().max(1e-9),
                elapsed: sums.elapsed,
                data_wait: sums.data_wait,
            };
            if log_epochs {
                println!("{summary}");
            }
            if let Some(observer) = observer.as_deref_mut() {
                observer
                    .on_epoch(&summary)
                    .map_err(|err| PipelineError::Observer(err.to_string()))?;
            }
            driven.epochs.push(summary);
        }
        if next.epoch > position.epoch && !finished {
            // The finished epoch's iterator holds the source: let it go first.
            drop(batches);
            batches = loader.batches(next.epoch as u64, 0);
        }
        position = next;
        if save && let Some((checkpointer, writes)) = checkpoints.as_mut() {
            writes.start(checkpointer, &position)?;
        }
        if stopping {
            driven.stopped_at = Some(position);
            break;
        }
    }
    if let Some((_, writes)) = checkpoints.as_mut() {
        writes.wait()?;
    }
    Ok(driven)
}

/// The validation loss and accuracy of `valid`'s batches, run forward through the first
/// pipeline (its stage threads come first in (group, stage) order). Across processes every
/// pipeline runs the pass, and only the first one's figures count: each pipeline's batch-norm
/// statistics follow its own batches, so the figures stay the first pipeline's, and no
/// process waits in the world's sum through another's whole pass (where the communicator's
/// timeout would end the job).
fn validate<B: Batch>(
    config: &PipelineConfig,
    valid: &mut (dyn BatchSource<Batch = B> + Send),
    to_stages: &ToStages<'_, B>,
) -> Result<(f32, f32), PipelineError> {
    let (mut loss_sum, mut correct, mut samples) = (0.0f64, 0usize, 0usize);
    for batch in valid.batches(0, 0) {
        let batch = batch?;
        let size = batch.samples();
        let micro_batches = cut(&batch, config.micro_batches.min(size).max(1))?;
        // The first pipeline's stages of this process (across processes: its stage).
        let first: Vec<_> = to_stages
            .threads
            .iter()
            .zip(to_stages.step_senders)
            .filter(|(thread, _)| to_stages.across.is_some() || **thread < to_stages.stages)
            .map(|(_, sender)| sender)
            .collect();
        for sender in &first {
            let data = StepData {
                lr: 0.0,
                micro_batches: micro_batches.clone(),
                samples: size,
                step: 0,
                save: false,
                check: false,
                panic: false,
                evaluate: true,
            };
            if sender.send(data).is_err() {
                return Err(PipelineError::PeerLost {
                    stage: to_stages.stages,
                    what: "a stage to validate".into(),
                });
            }
        }
        for _ in 0..first.len() {
            let report = to_stages
                .abort
                .recv(to_stages.done, config.timeout)
                .map_err(|_| PipelineError::PeerLost {
                    stage: to_stages.stages,
                    what: "a stage's validation report".into(),
                })?;
            if report.thread < to_stages.stages {
                loss_sum += report.loss_sum;
                correct += report.correct;
            }
        }
        samples += size;
    }
    (loss_sum, correct) = sum_across(to_stages.across, loss_sum, correct)?;
    let samples = samples.max(1) as f64;
    Ok((
        (loss_sum / samples) as f32,
        (correct as f64 / samples) as f32,
    ))
}

/// `loss_sum` and `correct` summed over the processes of `across` (as they are without).
fn sum_across(
    across: Option<&Communicator>,
    loss_sum: f64,
    correct: usize,
) -> Result<(f64, usize), PipelineError> {
    let Some(world) = across else {
        return Ok((loss_sum, correct));
    };
    let mut values = [loss_sum as f32, correct as f32];
    world
        .all_reduce(&mut values, kiln_comm::ReduceOp::Sum)
        .map_err(|err| PipelineError::PeerLost {
            stage: 0,
            what: format!("the other processes' step results ({err})"),
        })?;
    Ok((f64::from(values[0]), values[1] as usize))
}

/// Whether to stop after this step: `asked` here, or across processes in any of them (a
/// signal may reach some of them only, or not at once), so that every one stops, and
/// saves, at the same step.
fn agree_to_stop(across: Option<&Communicator>, asked: bool) -> Result<bool, PipelineError> {
    let Some(world) = across else {
        return Ok(asked);
    };
    let mut flag = [if asked { 1.0f32 } else { 0.0 }];
    world
        .all_reduce(&mut flag, kiln_comm::ReduceOp::Max)
        .map_err(|err| PipelineError::PeerLost {
            stage: 0,
            what: format!("the other processes' stop requests ({err})"),
        })?;
    Ok(flag[0] > 0.0)
}

/// Adds `times` element-wise into `total` (which starts empty).
fn add_into(total: &mut Vec<Duration>, times: &[Duration]) {
    total.resize(times.len().max(total.len()), Duration::ZERO);
    total.iter_mut().zip(times).for_each(|(t, d)| *t += *d);
}

/// `batch` cut into `count` micro-batches along the batch dimension (sizes differ by at most
/// one, larger first); too few samples is a configuration error of the run.
fn cut<B: Batch>(batch: &B, count: usize) -> Result<Vec<B>, PipelineError> {
    cut_batch(batch, count).map_err(|err| PipelineError::Config(err.to_string()))
}
