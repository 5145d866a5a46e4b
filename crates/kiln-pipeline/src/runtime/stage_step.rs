//! One training step on a stage: its actions of the schedule in order, with the values they
//! pass each other, ending in its optimizer step.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use kiln_amp::MixedPrecision;
use kiln_core::Segmented;
use kiln_data::Batch;
use kiln_train::Objective;

use crate::runtime::PipelineError;
use crate::runtime::mailbox::{Carries, Mailbox, Message};
use crate::runtime::overlap::CopiesReduce;
use crate::runtime::stage::{Forwarded, Input, Stage};
use crate::runtime::worker::{Links, StepData, StepDone, Update};
use crate::schedule::{Action, Schedule};

/// Runs stage `index`'s actions of `schedule` for the training step `data`: returns the
/// stage once its optimizer stepped, and the step's report. `copies` add their gradients
/// with the stage's (several data-parallel groups).
pub(crate) fn train_step<M, O>(
    index: usize,
    mut stage: Stage<M>,
    (schedule, objective): (&Schedule, &O),
    update: &mut Update,
    links: &mut Links<'_, M::Hidden>,
    copies: &mut Option<CopiesReduce>,
    data: &StepData<O::Batch>,
) -> Result<(Stage<M>, StepDone), PipelineError>
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output> + 'static,
{
    if data.panic && index + 1 == schedule.stages() {
        panic!(
            "injected fault at step {} (PipelineConfig::panic_at_step)",
            data.step
        );
    }
    let mut step = StepRun::new(index, &stage, (schedule, objective), update, links, data);
    for (position, action) in schedule.actions(index).iter().enumerate() {
        match *action {
            Action::Forward { micro, chunk } => {
                step.forward(&stage, &mut links.mailbox, micro, chunk)?;
            }
            Action::SendActivation { micro, chunk, to } => {
                step.send_activation(&links.peers[to], micro, chunk);
            }
            Action::RecvActivation { .. } | Action::RecvGradient { .. } => {
                // Taken from the mailbox when the compute needs it (messages may arrive
                // in any order; the mailbox holds the early ones).
            }
            Action::Backward { micro, chunk } => {
                step.backward(&mut stage, &mut links.mailbox, micro, chunk)?;
                if let Some(copies) = copies.as_mut() {
                    copies.backward_done(position, chunk, &stage);
                }
            }
            Action::SendGradient { micro, chunk, to } => {
                step.send_gradient(&links.peers[to], micro, chunk);
            }
            Action::ReduceGradients => {
                // One pipeline has nothing to reduce; data-parallel copies of this stage
                // add their summed gradients.
                if let Some(copies) = copies.as_mut() {
                    copies.finish(&mut stage, index)?;
                }
            }
            Action::OptimizerStep => {
                step.working = None; // the step is done with it
                // Tied parameters shared with other stages: their gradients summed
                // between the stages (each stage's already over its copies).
                stage.sum_tied(index, links.pipeline)?;
                stage = stage.step(
                    index,
                    &mut update.rule,
                    links.pipeline,
                    &mut update.optimizer,
                    data.lr,
                    data.samples,
                )?;
            }
        }
    }
    if data.check {
        if let Some(copies) = copies.as_ref() {
            stage.check_copies(index, copies.worker(), data.step)?;
        }
        stage.check_tied(index, links.pipeline, data.step)?;
    }
    let mut report = step.report;
    report.loss_scale = update.rule.loss_scale();
    Ok((stage, report))
}

/// A training step under way on one stage: what it runs on, the values waiting between its
/// actions, and its report so far.
struct StepRun<'s, M: Segmented, O: Objective> {
    /// The stage (device) running it.
    index: usize,
    /// The run's schedule.
    schedule: &'s Schedule,
    /// Feeds the first virtual stage and scores the last.
    objective: &'s O,
    /// The step's micro-batches.
    micro_batches: &'s [O::Batch],
    /// Samples in each micro-batch.
    sizes: Vec<usize>,
    /// The last virtual stage (which computes the loss).
    last_virtual: usize,
    /// Outputs waiting to be sent or handed to this stage's next chunk.
    outputs: HashMap<(usize, usize), M::Hidden>,
    /// Forward state kept for backward.
    forwarded: HashMap<(usize, usize), Forwarded<M::Hidden>>,
    /// Gradients of chunk inputs, waiting to be sent or handed to the previous chunk.
    input_grads: HashMap<(usize, usize), M::Hidden>,
    /// Micro-batches (counting each chunk) whose forward has run and backward not.
    in_flight: usize,
    /// The stage's mixed precision.
    precision: MixedPrecision,
    /// Mixed precision: the stage's parameters cast once per step (`None`: f32, the master).
    working: Option<M>,
    /// What the step did so far.
    report: StepDone,
}

impl<'s, M, O> StepRun<'s, M, O>
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output> + 'static,
{
    /// The start of stage `index`'s step on `data`, nothing computed yet.
    fn new(
        index: usize,
        stage: &Stage<M>,
        (schedule, objective): (&'s Schedule, &'s O),
        update: &Update,
        links: &Links<'_, M::Hidden>,
        data: &'s StepData<O::Batch>,
    ) -> Self {
        let sizes: Vec<usize> = data.micro_batches.iter().map(Batch::samples).collect();
        let report = StepDone {
            thread: links.thread,
            forward: vec![Duration::ZERO; schedule.chunks()],
            backward: vec![Duration::ZERO; schedule.chunks()],
            ..StepDone::default()
        };
        let precision = update.rule.precision().clone();
        let working = precision.working_copy(&stage.model);
        Self {
            index,
            schedule,
            objective,
            micro_batches: &data.micro_batches,
            sizes,
            last_virtual: schedule.virtual_stages() - 1,
            outputs: HashMap::new(),
            forwarded: HashMap::new(),
            input_grads: HashMap::new(),
            in_flight: 0,
            precision,
            working,
            report,
        }
    }

    /// Forward of micro-batch `micro` through chunk `chunk`, its input from the micro-batch,
    /// this stage's previous chunk or the `mailbox`.
    fn forward(
        &mut self,
        stage: &Stage<M>,
        mailbox: &mut Mailbox<M::Hidden>,
        micro: usize,
        chunk: usize,
    ) -> Result<(), PipelineError> {
        let virtual_stage = self.schedule.virtual_stage(self.index, chunk);
        let input = if virtual_stage == 0 {
            Input::Model(Box::new(self.objective.input(&self.micro_batches[micro])))
        } else if let Some(hidden) = self.outputs.remove(&(micro, virtual_stage - 1)) {
            Input::Hidden(hidden) // the previous chunk is on this stage
        } else {
            Input::Hidden(mailbox.take(Carries::Activation, micro, virtual_stage)?)
        };
        let targets = (virtual_stage == self.last_virtual).then(|| &self.micro_batches[micro]);
        let start = Instant::now();
        let (state, loss) = stage.forward(
            self.working.as_ref(),
            (&self.precision, self.objective),
            chunk,
            input,
            targets,
        );
        let elapsed = stage.emulate(start.elapsed());
        let report = &mut self.report;
        report.forward[chunk] += elapsed;
        if let Some((loss, correct)) = loss {
            report.loss_sum += f64::from(loss) * self.sizes[micro] as f64;
            report.correct += correct;
        }
        if let Some(output) = state.output_for_next() {
            self.outputs.insert((micro, virtual_stage), output);
        }
        self.forwarded.insert((micro, chunk), state);
        self.in_flight += 1;
        report.peak_in_flight = report.peak_in_flight.max(self.in_flight);
        Ok(())
    }

    /// Backward of micro-batch `micro` through chunk `chunk`, its output's gradient from the
    /// loss, this stage's next chunk or the `mailbox`.
    fn backward(
        &mut self,
        stage: &mut Stage<M>,
        mailbox: &mut Mailbox<M::Hidden>,
        micro: usize,
        chunk: usize,
    ) -> Result<(), PipelineError> {
        let virtual_stage = self.schedule.virtual_stage(self.index, chunk);
        let upstream = if virtual_stage == self.last_virtual {
            None
        } else if let Some(grad) = self.input_grads.remove(&(micro, virtual_stage + 1)) {
            Some(grad) // the next chunk is on this stage
        } else {
            Some(mailbox.take(Carries::Gradient, micro, virtual_stage)?)
        };
        let state = self
            .forwarded
            .remove(&(micro, chunk))
            .expect("forward ran first");
        let start = Instant::now();
        let weight = self.precision.gradient_weight(self.sizes[micro]);
        let working = self.working.as_ref();
        let grad = stage.backward(working, self.index, chunk, state, upstream, weight)?;
        let elapsed = stage.emulate(start.elapsed());
        self.report.backward[chunk] += elapsed;
        self.in_flight -= 1;
        if let Some(grad) = grad {
            self.input_grads.insert((micro, virtual_stage), grad);
        }
        Ok(())
    }

    /// Sends chunk `chunk`'s output for micro-batch `micro` to the stage `peer` feeds.
    fn send_activation(&mut self, peer: &Sender<Message<M::Hidden>>, micro: usize, chunk: usize) {
        let from = self.schedule.virtual_stage(self.index, chunk);
        let value = self
            .outputs
            .remove(&(micro, from))
            .expect("sent after its forward");
        send(peer, Carries::Activation, micro, from + 1, value);
    }

    /// Sends the gradient of chunk `chunk`'s input for micro-batch `micro` to the stage
    /// `peer` feeds.
    fn send_gradient(&mut self, peer: &Sender<Message<M::Hidden>>, micro: usize, chunk: usize) {
        let from = self.schedule.virtual_stage(self.index, chunk);
        let value = self
            .input_grads
            .remove(&(micro, from))
            .expect("sent after its backward");
        send(peer, Carries::Gradient, micro, from - 1, value);
    }
}

/// Sends `value` to a peer; a peer that is gone shows up as its own error on the driver.
fn send<H>(peer: &Sender<Message<H>>, carries: Carries, micro: usize, to: usize, value: H) {
    let _ = peer.send(Message {
        carries,
        micro,
        to,
        value,
    });
}
