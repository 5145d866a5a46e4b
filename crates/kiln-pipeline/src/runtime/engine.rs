//! The pipeline's step engine under kiln's one training loop ([`kiln_train::train_loop`]):
//! cuts each step's batches into micro-batches, hands every stage of every data-parallel
//! group its step, collects their reports; saves and validates through the stages.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use kiln_checkpoint::Checkpointer;
use kiln_comm::Communicator;
use kiln_data::{Batch, BatchSource, cut_batch};
use kiln_train::{EngineStep, Evaluation, StepEngine, TrainPosition};

use crate::runtime::checkpoint::Writes;
use crate::runtime::mailbox::Abort;
use crate::runtime::worker::{StepData, StepDone, Work};
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

/// Compute times per stage thread (summed over steps) and the steps' time.
#[derive(Default, Clone)]
pub(crate) struct Timings {
    pub forward: Vec<Vec<Duration>>,
    pub backward: Vec<Vec<Duration>>,
    pub step_time: Duration,
    pub steps: u32,
}

/// What the engine measured, per stage thread.
#[derive(Default)]
pub(crate) struct Driven {
    /// Steps after the first (the first alone when it was the only one).
    pub timed: Timings,
    pub peak: Vec<usize>,
}

/// The stages of this process, seen from the training loop.
pub(crate) struct StagesEngine<'a, 'w, B> {
    config: &'a PipelineConfig,
    to_stages: ToStages<'a, B>,
    /// Checkpoints, and the writes under way.
    checkpoints: Option<(&'a Checkpointer, &'a mut Writes<'w>)>,
    /// The first step's times (the report leaves them out: they hold the warm-up).
    first: Option<Timings>,
    timed: Timings,
    peak: Vec<usize>,
}

impl<'a, 'w, B: Batch> StagesEngine<'a, 'w, B> {
    pub(crate) fn new(
        config: &'a PipelineConfig,
        to_stages: ToStages<'a, B>,
        checkpoints: Option<(&'a Checkpointer, &'a mut Writes<'w>)>,
    ) -> Self {
        let threads = to_stages.total;
        let timings = Timings::for_threads(threads);
        Self {
            config,
            to_stages,
            checkpoints,
            first: None,
            timed: timings,
            peak: vec![0; threads],
        }
    }

    /// What it measured.
    pub(crate) fn driven(self) -> Driven {
        let timed = match self.first {
            Some(first) if self.timed.steps == 0 => first,
            _ => self.timed,
        };
        Driven {
            timed,
            peak: self.peak,
        }
    }

    /// Data-parallel pipelines (D).
    fn groups(&self) -> usize {
        self.to_stages.total / self.to_stages.stages.max(1)
    }

    /// Sends `data(thread)` to every stage thread of this process that `to` admits.
    fn send(
        &self,
        to: impl Fn(usize) -> bool,
        data: impl Fn(usize) -> StepData<B>,
        what: &str,
    ) -> Result<usize, PipelineError> {
        let mut sent = 0;
        for (&thread, sender) in self
            .to_stages
            .threads
            .iter()
            .zip(self.to_stages.step_senders)
        {
            if !to(thread) {
                continue;
            }
            if sender.send(data(thread)).is_err() {
                return Err(self.lost(&format!("a stage to {what}")));
            }
            sent += 1;
        }
        Ok(sent)
    }

    /// The next stage report, bounded by the timeout.
    fn report(&self, what: &str) -> Result<StepDone, PipelineError> {
        self.to_stages
            .abort
            .recv(self.to_stages.done, self.config.timeout)
            .map_err(|_| self.lost(what))
    }

    fn lost(&self, what: &str) -> PipelineError {
        PipelineError::PeerLost {
            stage: self.to_stages.stages,
            what: what.into(),
        }
    }
}

impl<B: Batch> StepEngine<B> for StagesEngine<'_, '_, B> {
    type Error = PipelineError;

    /// One batch per data-parallel pipeline per accumulated micro-step (consecutive
    /// batches of the loader).
    fn batches_per_step(&self) -> usize {
        self.groups() * self.config.accumulation
    }

    fn step(&mut self, batches: Vec<B>, step: usize, lr: f64) -> Result<EngineStep, PipelineError> {
        let stages = self.to_stages.stages;
        // Each pipeline's micro-batches: those of its `accumulation` consecutive batches.
        let mut cuts = Vec::with_capacity(self.groups());
        for own in batches.chunks(self.config.accumulation) {
            let mut micro_batches = Vec::with_capacity(self.config.micro_batches_per_step());
            for batch in own {
                micro_batches.extend(cut(batch, self.config.micro_batches)?);
            }
            cuts.push(micro_batches);
        }
        let samples: usize = batches.iter().map(Batch::samples).sum();
        let check =
            self.config.check_every > 0 && (step + 1).is_multiple_of(self.config.check_every);
        let began = Instant::now();
        let sent = self.send(
            |_| true,
            |thread| StepData {
                lr,
                micro_batches: cuts[thread / stages].clone(),
                samples,
                step,
                work: Work::Train,
                check,
                panic: self.config.panic_at_step == Some(step),
            },
            "take the step",
        )?;
        let mut timings = Timings {
            steps: 1,
            ..Timings::for_threads(self.to_stages.total)
        };
        let (mut loss_sum, mut correct, mut loss_scale) = (0.0, 0, None);
        for _ in 0..sent {
            let report = self.report("a stage's step report")?;
            loss_sum += report.loss_sum;
            correct += report.correct;
            loss_scale = loss_scale.or(report.loss_scale);
            let thread = report.thread;
            add_into(&mut timings.forward[thread], &report.forward);
            add_into(&mut timings.backward[thread], &report.backward);
            self.peak[thread] = self.peak[thread].max(report.peak_in_flight);
        }
        // Stages in other processes: the loss is the last stage's, wherever it runs.
        (loss_sum, correct) = sum_across(self.to_stages.across, loss_sum, correct)?;
        timings.step_time = began.elapsed();
        if self.first.is_none() {
            self.first = Some(timings);
        } else {
            self.timed.add(&timings);
        }
        Ok(EngineStep {
            loss: (loss_sum / samples.max(1) as f64) as f32,
            correct,
            samples,
            loss_scale,
        })
    }

    fn agree_to_stop(&mut self, asked: bool) -> Result<bool, PipelineError> {
        agree_to_stop(self.to_stages.across, asked)
    }

    fn checkpoint_due(&self, position: &TrainPosition, last: bool) -> bool {
        self.checkpoints
            .as_ref()
            .is_some_and(|(checkpointer, _)| checkpointer.is_due(position, last))
    }

    /// The first pipeline's stages hand over their parts (encoded on threads of their own,
    /// so they go on with the next step), and a writer joins them.
    fn checkpoint(&mut self, position: &TrainPosition) -> Result<(), PipelineError> {
        let sent = self.send(
            |_| true,
            |_| StepData {
                lr: 0.0,
                micro_batches: Vec::new(),
                samples: 0,
                step: position.step,
                work: Work::Save,
                check: false,
                panic: false,
            },
            "save",
        )?;
        for _ in 0..sent {
            self.report("a stage's checkpoint part")?;
        }
        if let Some((checkpointer, writes)) = self.checkpoints.as_mut() {
            writes.start(checkpointer, position)?;
        }
        Ok(())
    }

    fn end_epoch(
        &mut self,
        _epoch: usize,
        valid: Option<&mut dyn BatchSource<Batch = B>>,
    ) -> Result<Option<Evaluation>, PipelineError> {
        valid.map(|valid| self.validate(valid)).transpose()
    }

    fn finish(&mut self) -> Result<(), PipelineError> {
        if let Some((_, writes)) = self.checkpoints.as_mut() {
            writes.wait()?;
        }
        Ok(())
    }
}

impl<B: Batch> StagesEngine<'_, '_, B> {
    /// The validation loss and accuracy of `valid`'s batches, run forward through the first
    /// pipeline (its stage threads come first in (group, stage) order). Across processes
    /// every pipeline runs the pass, and only the first one's figures count: each pipeline's
    /// batch-norm statistics follow its own batches, so the figures stay the first
    /// pipeline's, and no process waits in the world's sum through another's whole pass
    /// (where the communicator's timeout would end the job).
    fn validate(
        &self,
        valid: &mut dyn BatchSource<Batch = B>,
    ) -> Result<Evaluation, PipelineError> {
        let stages = self.to_stages.stages;
        let across = self.to_stages.across.is_some();
        let (mut loss_sum, mut correct, mut samples) = (0.0f64, 0usize, 0usize);
        for batch in valid.batches(0, 0) {
            let batch = batch?;
            let size = batch.samples();
            let micro_batches = cut(&batch, self.config.micro_batches.min(size).max(1))?;
            // The first pipeline's stages of this process (across processes: its stage).
            let sent = self.send(
                |thread| across || thread < stages,
                |_| StepData {
                    lr: 0.0,
                    micro_batches: micro_batches.clone(),
                    samples: size,
                    step: 0,
                    work: Work::Evaluate,
                    check: false,
                    panic: false,
                },
                "validate",
            )?;
            for _ in 0..sent {
                let report = self.report("a stage's validation report")?;
                if report.thread < stages {
                    loss_sum += report.loss_sum;
                    correct += report.correct;
                }
            }
            samples += size;
        }
        (loss_sum, correct) = sum_across(self.to_stages.across, loss_sum, correct)?;
        let divisor = samples.max(1) as f64;
        Ok(Evaluation {
            loss: (loss_sum / divisor) as f32,
            accuracy: (correct as f64 / divisor) as f32,
            samples,
        })
    }
}

impl Timings {
    /// No time yet, for `threads` stage threads.
    fn for_threads(threads: usize) -> Self {
        Timings {
            forward: vec![Vec::new(); threads],
            backward: vec![Vec::new(); threads],
            ..Timings::default()
        }
    }

    /// Adds `other`'s times into these.
    fn add(&mut self, other: &Timings) {
        for (total, times) in self.forward.iter_mut().zip(&other.forward) {
            add_into(total, times);
        }
        for (total, times) in self.backward.iter_mut().zip(&other.backward) {
            add_into(total, times);
        }
        self.step_time += other.step_time;
        self.steps += other.steps;
    }
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
