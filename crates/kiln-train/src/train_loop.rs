//! kiln's one training loop: epochs and steps, the learning rate, resume positions, stop
//! agreement, checkpoint and validation timing, records, observers, the progress bar and
//! the summaries, for every plan (a [`StepEngine`]).

use std::time::{Duration, Instant};

use kiln_data::{Batch, BatchSource};

use crate::metrics::{EpochSummary, FirstStep, StepRecord, TrainReport};
use crate::progress::epoch_bar;
use crate::{
    EngineStep, LrSchedule, Reporting, StepEngine, StopFlag, TrainError, TrainObserver,
    TrainPosition,
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
    /// How the printed lines name samples and whether they show accuracy (the objective's).
    pub reporting: Reporting,
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
    let per_step = engine.batches_per_step();
    let per_epoch = train.num_batches() / per_step.max(1);
    if per_epoch == 0 {
        return Err(TrainError::Config(format!(
            "the training data gives {} batches per epoch, fewer than the {per_step} one step takes (accumulated micro-batches x data-parallel pipelines)",
            train.num_batches()
        ))
        .into());
    }
    let start = options.start;
    if start.step_in_epoch >= per_epoch {
        return Err(TrainError::checkpoint(format!(
            "resuming at step {} of epoch {}, which has only {per_epoch} steps (another batch size or data set?)",
            start.step_in_epoch, start.epoch
        ))
        .into());
    }
    let (epochs, total_steps) = match options.budget {
        Budget::Epochs(epochs) => (epochs, epochs * per_epoch),
        Budget::Steps(steps) => (steps.div_ceil(per_epoch), steps),
    };
    let mut run = Run {
        options,
        per_step,
        per_epoch,
        total_steps,
        report: TrainReport::default(),
        step: start.step,
        saved_at_stop: false,
    };
    for epoch in start.epoch..epochs {
        // A resumed epoch skips the steps done before the checkpoint.
        let skip = if epoch == start.epoch {
            start.step_in_epoch
        } else {
            0
        };
        let steps = (per_epoch - skip).min(total_steps.saturating_sub(run.step));
        if steps == 0 {
            // Resumed at the end of training: nothing is left to do.
            break;
        }
        let Some((sums, elapsed)) = run.epoch(engine, train, epoch, skip..skip + steps)? else {
            break; // stopped mid-epoch: the resumed run finishes the epoch (and validates it)
        };
        run.end_epoch(engine, epoch, sums, elapsed)?;
        if run.report.stopped_at.is_some() {
            break;
        }
    }
    engine.finish()?;
    if run.options.log_epochs {
        print_end(
            &run.report,
            run.step,
            run.saved_at_stop,
            run.options.reporting,
        );
    }
    Ok(run.report)
}

/// A run under way: its options and what it has recorded.
struct Run<'a, B> {
    options: LoopOptions<'a, B>,
    /// Loader batches per step.
    per_step: usize,
    /// Steps per epoch.
    per_epoch: usize,
    /// The step training ends at.
    total_steps: usize,
    report: TrainReport,
    /// Steps done.
    step: usize,
    /// Whether a checkpoint was saved where a stop request ended the run.
    saved_at_stop: bool,
}

impl<B: Batch> Run<'_, B> {
    /// Runs epoch `epoch`'s steps `steps` (after the ones done before a resume): its sums
    /// and time, or `None` when a stop request ended it midway.
    fn epoch<E, S>(
        &mut self,
        engine: &mut E,
        train: &mut S,
        epoch: usize,
        steps: std::ops::Range<usize>,
    ) -> Result<Option<(EpochSums, Duration)>, E::Error>
    where
        E: StepEngine<B>,
        S: BatchSource<Batch = B> + ?Sized,
    {
        let per_step = self.per_step;
        let bar = epoch_bar(self.options.progress, epoch, steps.len());
        let mut sums = EpochSums::default();
        let started = Instant::now();
        let mut batches = train.batches(epoch as u64, steps.start * per_step);
        for done_in_epoch in steps.start + 1..=steps.end {
            let step_start = Instant::now();
            // Any source: the time the step waits for its batches is the data wait.
            let taken = batches
                .by_ref()
                .take(per_step)
                .collect::<Result<Vec<_>, _>>()?;
            let data_wait = step_start.elapsed();
            if taken.len() < per_step {
                return Err(TrainError::Config(format!(
                    "the training data's epoch {epoch} ended before its step {done_in_epoch} of {} (it gave fewer batches than it said)",
                    self.per_epoch
                ))
                .into());
            }
            let step = self.step;
            let lr = self.options.schedule.lr(step);
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
            self.report.first_step.get_or_insert_with(|| FirstStep {
                finished: Instant::now(),
                took: step_start.elapsed(),
            });
            for observer in self.options.observers.iter_mut() {
                observer.on_step(&record)?;
            }
            sums.add(&out, data_wait);
            self.step += 1;
            let position = if done_in_epoch == self.per_epoch {
                TrainPosition {
                    step: self.step,
                    epoch: epoch + 1,
                    step_in_epoch: 0,
                }
            } else {
                TrainPosition {
                    step: self.step,
                    epoch,
                    step_in_epoch: done_in_epoch,
                }
            };
            let stopping = self.after_step(engine, &position)?;
            bar.inc(1);
            let reporting = self.options.reporting;
            let accuracy = if reporting.accuracy {
                format!(" acc {:5.1}%", 100.0 * record.accuracy)
            } else {
                String::new()
            };
            bar.set_message(format!(
                "loss {:.4}{accuracy} {:.0} {}/s lr {lr:.4}",
                record.loss, record.images_per_sec, reporting.sample
            ));
            self.report.steps.push(record);
            if stopping {
                self.report.stopped_at = Some(position);
                if position.step_in_epoch != 0 {
                    bar.finish_and_clear();
                    return Ok(None);
                }
                // The epoch's last step: validate and log the epoch, then stop.
                break;
            }
        }
        // The finished epoch's iterator holds the source: let it go first.
        drop(batches);
        bar.finish_and_clear();
        Ok(Some((sums, started.elapsed())))
    }

    /// After a step that ended at `position`: the stop agreement and a checkpoint when one
    /// is due; whether training stops here.
    fn after_step<E: StepEngine<B>>(
        &mut self,
        engine: &mut E,
        position: &TrainPosition,
    ) -> Result<bool, E::Error> {
        // Without a flag nobody can ask: no agreement (no collective) is needed.
        let stopping = match self.options.stop {
            Some(flag) => engine.agree_to_stop(flag.is_requested())?,
            None => false,
        };
        let save = engine.checkpoint_due(position, stopping || self.step == self.total_steps);
        if save {
            engine.checkpoint(position)?;
        }
        if stopping {
            self.saved_at_stop = save;
        }
        Ok(stopping)
    }

    /// Ends epoch `epoch` (validation through the engine) and records its summary.
    fn end_epoch<E: StepEngine<B>>(
        &mut self,
        engine: &mut E,
        epoch: usize,
        sums: EpochSums,
        elapsed: Duration,
    ) -> Result<(), E::Error> {
        let valid = self
            .options
            .valid
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
        if self.options.log_epochs {
            println!("{}", summary.line(self.options.reporting));
        }
        for observer in self.options.observers.iter_mut() {
            observer.on_epoch(&summary)?;
        }
        self.report.epochs.push(summary);
        Ok(())
    }
}

/// The run's last lines: where a stop ended it, and its throughput.
fn print_end(report: &TrainReport, steps: usize, saved: bool, reporting: Reporting) {
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
        .filter(|_| reporting.accuracy)
        .map(|a| format!(", final val acc {:.1}%", 100.0 * a))
        .unwrap_or_default();
    let unit = reporting.sample;
    println!(
        "done: {steps} steps, {images} {unit} in {secs:.1}s ({:.0} {unit}/s){val}",
        images as f64 / secs.max(1e-9)
    );
}
