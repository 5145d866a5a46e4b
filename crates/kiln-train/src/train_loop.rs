//! kiln's one training loop: epochs and steps, the learning rate, resume positions, stop
//! agreement, checkpoint and validation timing, records, observers, the progress bar and
//! the summaries, for every plan (a [`StepEngine`]).

use std::time::{Duration, Instant};

use kiln_data::{Batch, BatchSource};

use crate::metrics::{EpochSummary, FirstStep, StepRecord, TrainReport};
use crate::progress::epoch_bar;
use crate::{
    EngineStep, LrSchedule, StepEngine, StopFlag, TrainError, TrainObserver, TrainPosition,
};

/// How long to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Whole epochs of the training data.
    Epochs(usize),
    /// Optimizer steps in all (a resumed run counts the steps done before), across as many
    /// epochs as that takes.
    Steps(usize),
}

/// What goes on around an engine's steps in [`train_loop`].
pub struct LoopOptions<'a, B> {
    /// The learning rate of every step.
    pub schedule: &'a LrSchedule,
    /// How long to train.
    pub budget: Budget,
    /// Where the run starts (a resumed run: its checkpoint's position); the engine holds
    /// the state saved there.
    pub start: TrainPosition,
    /// Stops after the step during which it is raised (agreed by the engine).
    pub stop: Option<&'a StopFlag>,
    /// Told every step and epoch, in order.
    pub observers: &'a mut [Box<dyn TrainObserver>],
    /// Evaluated after every epoch.
    pub valid: Option<&'a mut dyn BatchSource<Batch = B>>,
    /// Shows the live progress bar.
    pub progress: bool,
    /// Prints a summary line per epoch and at the end.
    pub log_epochs: bool,
}

/// One epoch's running sums, for its summary.
#[derive(Default)]
struct EpochSums {
    loss: f64,
    correct: usize,
    samples: usize,
    data_wait: Duration,
}

impl EpochSums {
    fn add(&mut self, out: &EngineStep, data_wait: Duration) {
        self.loss += f64::from(out.loss) * out.samples as f64;
        self.correct += out.correct;
        self.samples += out.samples;
        self.data_wait += data_wait;
    }
}

/// Trains with `engine` on `train`'s batches, [`StepEngine::batches_per_step`] of them per
/// optimizer step, as `options` say; returns what was recorded. An epoch is the loader's
/// batches ÷ the batches of one step, whole steps only.
///
/// # Errors
/// Too few batches for one step, a resume position outside the data's epoch, a loader's
/// error, a non-finite loss, an observer's error, or the engine's.
pub fn train_loop<B, E, S>(
    engine: &mut E,
    train: &mut S,
    options: LoopOptions<'_, B>,
) -> Result<TrainReport, E::Error>
where
    B: Batch,
    E: StepEngine<B>,
    S: BatchSource<Batch = B> + ?Sized,
{
    let LoopOptions {
        schedule,
        budget,
        start,
        stop,
        observers,
        mut valid,
        progress,
        log_epochs,
    } = options;
    let per_step = engine.batches_per_step();
    let per_epoch = train.num_batches() / per_step.max(1);
    if per_epoch == 0 {
        return Err(TrainError::Config(format!(
            "the training data gives {} batches per epoch, fewer than the {per_step} one step takes (accumulated micro-batches x data-parallel pipelines)",
            train.num_batches()
        ))
        .into());
    }
    if start.step_in_epoch >= per_epoch {
        return Err(TrainError::Checkpoint(format!(
            "resuming at step {} of epoch {}, which has only {per_epoch} steps (another batch size or data set?)",
            start.step_in_epoch, start.epoch
        ))
        .into());
    }
    let (epochs, total_steps) = match budget {
        Budget::Epochs(epochs) => (epochs, epochs * per_epoch),
        Budget::Steps(steps) => (steps.div_ceil(per_epoch), steps),
    };
    let mut report = TrainReport::default();
    let mut step = start.step;
    let mut saved_at_stop = false;
    'epochs: for epoch in start.epoch..epochs {
        // A resumed epoch skips the steps done before the checkpoint.
        let skip = if epoch == start.epoch {
            start.step_in_epoch
        } else {
            0
        };
        let steps_this_epoch = (per_epoch - skip).min(total_steps.saturating_sub(step));
        if steps_this_epoch == 0 {
            // Resumed at the end of training: nothing is left to do.
            break;
        }
        let bar = epoch_bar(progress, epoch, steps_this_epoch);
        let mut sums = EpochSums::default();
        let started = Instant::now();
        let mut batches = train.batches(epoch as u64, skip * per_step);
        for done_in_epoch in skip + 1..=skip + steps_this_epoch {
            let step_start = Instant::now();
            // Any source: the time the step waits for its batches is the data wait.
            let taken = batches
                .by_ref()
                .take(per_step)
                .collect::<Result<Vec<_>, _>>()?;
            let data_wait = step_start.elapsed();
            if taken.len() < per_step {
                return Err(TrainError::Config(format!(
                    "the training data's epoch {epoch} ended before its step {done_in_epoch} of {per_epoch} (it gave fewer batches than it said)"
                ))
                .into());
            }
            let lr = schedule.lr(step);
            let out = engine.step(taken, step, lr)?;
            if !out.loss.is_finite() {
                return Err(TrainError::NonFiniteLoss {
                    step,
                    loss: out.loss,
                }
                .into());
            }
            let record = StepRecord {
                epoch,
                step,
                loss: out.loss,
                accuracy: out.correct as f32 / out.samples.max(1) as f32,
                lr,
                images_per_sec: out.samples as f64 / step_start.elapsed().as_secs_f64().max(1e-9),
                data_wait,
                loss_scale: out.loss_scale,
            };
            report.first_step.get_or_insert_with(|| FirstStep {
                finished: Instant::now(),
                took: step_start.elapsed(),
            });
            for observer in observers.iter_mut() {
                observer.on_step(&record)?;
            }
            sums.add(&out, data_wait);
            step += 1;
            let position = if done_in_epoch == per_epoch {
                TrainPosition {
                    step,
                    epoch: epoch + 1,
                    step_in_epoch: 0,
                }
            } else {
                TrainPosition {
                    step,
                    epoch,
                    step_in_epoch: done_in_epoch,
                }
            };
            // Without a flag nobody can ask: no agreement (no collective) is needed.
            let stopping = match stop {
                Some(flag) => engine.agree_to_stop(flag.is_requested())?,
                None => false,
            };
            let save = engine.checkpoint_due(&position, stopping || step == total_steps);
            if save {
                engine.checkpoint(&position)?;
            }
            bar.inc(1);
            bar.set_message(format!(
                "loss {:.4} acc {:5.1}% {:.0} img/s lr {lr:.4}",
                record.loss,
                100.0 * record.accuracy,
                record.images_per_sec
            ));
            report.steps.push(record);
            if stopping {
                report.stopped_at = Some(position);
                saved_at_stop = save;
                if position.step_in_epoch != 0 {
                    // Mid-epoch: the resumed run finishes the epoch (and validates it).
                    bar.finish_and_clear();
                    break 'epochs;
                }
                // The epoch's last step: validate and log the epoch, then stop.
                break;
            }
        }
        // The finished epoch's iterator holds the source: let it go first.
        drop(batches);
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        let valid = valid
            .as_deref_mut()
            .map(|v| v as &mut dyn BatchSource<Batch = B>);
        let evaluation = engine.end_epoch(epoch, valid)?;
        let summary = EpochSummary {
            epoch,
            train_loss: (sums.loss / sums.samples.max(1) as f64) as f32,
            train_accuracy: sums.correct as f32 / sums.samples.max(1) as f32,
            valid_loss: evaluation.map(|e| e.loss),
            valid_accuracy: evaluation.map(|e| e.accuracy),
            images_per_sec: sums.samples as f64 / elapsed.as_secs_f64().max(1e-9),
            elapsed,
            data_wait: sums.data_wait,
        };
        if log_epochs {
            println!("{summary}");
        }
        for observer in observers.iter_mut() {
            observer.on_epoch(&summary)?;
        }
        report.epochs.push(summary);
        if report.stopped_at.is_some() {
            break;
        }
    }
    engine.finish()?;
    if log_epochs {
        print_end(&report, step, saved_at_stop);
    }
    Ok(report)
}

/// The run's last lines: where a stop ended it, and its throughput.
fn print_end(report: &TrainReport, steps: usize, saved: bool) {
    if let Some(position) = report.stopped_at {
        let saved = if saved {
            ", after saving a checkpoint"
        } else {
            ""
        };
        println!("stopped at step {} as asked{saved}", position.step);
    }
    let images: usize = report
        .epochs
        .iter()
        .map(|e| (e.images_per_sec * e.elapsed.as_secs_f64()) as usize)
        .sum();
    let secs: f64 = report.epochs.iter().map(|e| e.elapsed.as_secs_f64()).sum();
    let val = report
        .final_valid_accuracy()
        .map(|a| format!(", final val acc {:.1}%", 100.0 * a))
        .unwrap_or_default();
    println!(
        "done: {steps} steps, {images} images in {secs:.1}s ({:.0} img/s){val}",
        images as f64 / secs.max(1e-9)
    );
}
