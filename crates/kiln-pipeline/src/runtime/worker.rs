//! One stage's thread: runs its actions of the schedule, step after step.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use burn::optim::ModuleOptimizer;
use crossbeam_channel::{Receiver, Sender};
use kiln_comm::Communicator;
use kiln_core::Segmented;
use kiln_data::{Batch, ImageBatch};
use kiln_train::{MeanGradient, Objective};

use crate::runtime::PipelineError;
use crate::runtime::checkpoint::{PartSender, hand_over};
use crate::runtime::evaluate::evaluate;
use crate::runtime::mailbox::{Carries, Mailbox, Message};
use crate::runtime::overlap::CopiesReduce;
use crate::runtime::stage::{Forwarded, Input, Stage};
use crate::schedule::{Action, Schedule};

/// What the driver hands every stage for one step (micro-batches of `B`).
pub(crate) struct StepData<B = ImageBatch> {
    /// The learning rate of this step.
    pub lr: f64,
    /// The step's micro-batches of this stage's data-parallel group (every stage uses their
    /// sizes; the first stage the model input, the last the targets).
    pub micro_batches: Vec<B>,
    /// Samples of the whole step, over every data-parallel group: the gradient's divisor.
    pub samples: usize,
    /// The step (0-based).
    pub step: usize,
    /// What to do with it.
    pub work: Work,
    /// Whether the data-parallel copies of each stage compare their parameters after it.
    pub check: bool,
    /// The last stage panics at this step (fault injection, `PipelineConfig::panic_at_step`).
    pub panic: bool,
}

/// What the driver asks of the stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// A training step on the micro-batches.
    Train,
    /// Validation: the micro-batches run forward only.
    Evaluate,
    /// A checkpoint at step `step` (no micro-batches): the first pipeline's stages hand
    /// over their parts.
    Save,
}

/// What a stage reports after a step.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepDone {
    /// The stage thread, in (data-parallel group, stage) order.
    pub thread: usize,
    /// Loss summed over samples, correct predictions (the last stage only).
    pub loss_sum: f64,
    pub correct: usize,
    /// Time spent in forward, per chunk, summed over micro-batches.
    pub forward: Vec<Duration>,
    /// Time spent in backward, per chunk, summed over micro-batches.
    pub backward: Vec<Duration>,
    /// The most micro-batches (counting each chunk) whose forward had run and backward not.
    pub peak_in_flight: usize,
    /// The loss scale the next step uses (mixed precision with a scaler).
    pub loss_scale: Option<f32>,
}

/// How a stage turns its summed gradients into an update: the mean-gradient rule (division,
/// clipping) and the optimizer.
pub(crate) struct Update {
    pub optimizer: ModuleOptimizer,
    pub rule: MeanGradient,
}

/// A stage's links: its mailbox, a sender to every stage of its pipeline, and (with several
/// data-parallel groups) its rank in the group of the copies of this stage.
pub(crate) struct Links<'a, H> {
    pub mailbox: Mailbox<H>,
    pub peers: Vec<Sender<Message<H>>>,
    pub replicas: Option<Communicator>,
    /// The stages of its own pipeline (with more than one), which agree on the gradient's
    /// norm and the loss scaler's overflow flag and sum the gradients of tied parameters
    /// they share: an in-process group, or across processes the pipeline's communicator
    /// (one stage per process). Borrowed, because across processes it is the run's, shared
    /// with the driver.
    pub pipeline: Option<&'a Communicator>,
    /// The stage thread, in (data-parallel group, stage) order.
    pub thread: usize,
    /// Where the stage's checkpoint parts go (the first pipeline's stages, with checkpoints).
    pub parts: Option<PartSender>,
    /// Its device, when it reads batches (the first and the last stage) and the pipeline's
    /// stages sit on several devices: the micro-batches move there (`transfer.rs`).
    pub batches_to: Option<burn::tensor::Device>,
}

/// Runs `stage`'s part of `schedule` for every step the driver sends, until it stops
/// sending; returns the trained stage. `objective` feeds the first virtual stage and scores
/// the last.
pub(crate) fn run_stage<M, O>(
    index: usize,
    mut stage: Stage<M>,
    (schedule, objective): (&Schedule, &O),
    mut update: Update,
    mut links: Links<'_, M::Hidden>,
    steps: Receiver<StepData<O::Batch>>,
    done: Sender<StepDone>,
) -> Result<Stage<M>, PipelineError>
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output> + 'static,
{
    let last_virtual = schedule.virtual_stages() - 1;
    // The copies of this stage add their gradients on a communication thread, each chunk's
    // as soon as it is final.
    let mut copies = links
        .replicas
        .take()
        .map(|replicas| CopiesReduce::new(replicas, &stage, schedule, index));
    while let Ok(mut data) = steps.recv() {
        if let Some(device) = &links.batches_to {
            data.move_batches(device, index)?;
        }
        // Validation and checkpoints answer at once; a training step runs below.
        let answered = match data.work {
            Work::Train => None,
            Work::Evaluate => Some(evaluate(
                index,
                (&stage, objective),
                schedule,
                &mut links,
                &data,
            )?),
            Work::Save => {
                if let Some(parts) = &links.parts {
                    let step_state = update.rule.saved_state();
                    hand_over(
                        index,
                        data.step,
                        (&stage.model, &update.optimizer, step_state),
                        &stage.owned_ids,
                        parts,
                    );
                }
                Some(StepDone {
                    thread: links.thread,
                    ..StepDone::default()
                })
            }
        };
        if let Some(report) = answered {
            if done.send(report).is_err() {
                break; // the driver stopped
            }
            continue;
        }
        if data.panic && index + 1 == schedule.stages() {
            panic!(
                "injected fault at step {} (PipelineConfig::panic_at_step)",
                data.step
            );
        }
        let sizes: Vec<usize> = data.micro_batches.iter().map(Batch::samples).collect();
        let mut report = StepDone {
            thread: links.thread,
            forward: vec![Duration::ZERO; schedule.chunks()],
            backward: vec![Duration::ZERO; schedule.chunks()],
            ..StepDone::default()
        };
        // Outputs waiting to be sent or handed to this stage's next chunk, inputs received,
        // forward state kept for backward, and gradients of chunk inputs.
        let mut outputs: HashMap<(usize, usize), M::Hidden> = HashMap::new();
        let mut forwarded: HashMap<(usize, usize), Forwarded<M::Hidden>> = HashMap::new();
        let mut input_grads: HashMap<(usize, usize), M::Hidden> = HashMap::new();
        let mut in_flight = 0usize;
        // Mixed precision: the stage's parameters cast once per step (f32: the master).
        let precision = update.rule.precision().clone();
        let mut working = precision.working_copy(&stage.model);
        for (position, action) in schedule.actions(index).iter().enumerate() {
            match *action {
                Action::Forward { micro, chunk } => {
                    let virtual_stage = schedule.virtual_stage(index, chunk);
                    let input = if virtual_stage == 0 {
                        Input::Model(Box::new(objective.input(&data.micro_batches[micro])))
                    } else if let Some(hidden) = outputs.remove(&(micro, virtual_stage - 1)) {
                        Input::Hidden(hidden) // the previous chunk is on this stage
                    } else {
                        Input::Hidden(links.mailbox.take(
                            Carries::Activation,
                            micro,
                            virtual_stage,
                        )?)
                    };
                    let targets =
                        (virtual_stage == last_virtual).then(|| &data.micro_batches[micro]);
                    let start = Instant::now();
                    let (state, loss) = stage.forward(
                        working.as_ref(),
                        (&precision, objective),
                        chunk,
                        input,
                        targets,
                    );
                    let elapsed = stage.emulate(start.elapsed());
                    report.forward[chunk] += elapsed;
                    if let Some((loss, correct)) = loss {
                        report.loss_sum += f64::from(loss) * sizes[micro] as f64;
                        report.correct += correct;
                    }
                    if let Some(output) = state.output_for_next() {
                        outputs.insert((micro, virtual_stage), output);
                    }
                    forwarded.insert((micro, chunk), state);
                    in_flight += 1;
                    report.peak_in_flight = report.peak_in_flight.max(in_flight);
                }
                Action::SendActivation { micro, chunk, to } => {
                    let from = schedule.virtual_stage(index, chunk);
                    let value = outputs
                        .remove(&(micro, from))
                        .expect("sent after its forward");
                    send(
                        &links.peers[to],
                        Carries::Activation,
                        micro,
                        from + 1,
                        value,
                    );
                }
                Action::RecvActivation { .. } | Action::RecvGradient { .. } => {
                    // Taken from the mailbox when the compute needs it (messages may arrive
                    // in any order; the mailbox holds the early ones).
                }
                Action::Backward { micro, chunk } => {
                    let virtual_stage = schedule.virtual_stage(index, chunk);
                    let upstream = if virtual_stage == last_virtual {
                        None
                    } else if let Some(grad) = input_grads.remove(&(micro, virtual_stage + 1)) {
                        Some(grad) // the next chunk is on this stage
                    } else {
                        Some(
                            links
                                .mailbox
                                .take(Carries::Gradient, micro, virtual_stage)?,
                        )
                    };
                    let state = forwarded
                        .remove(&(micro, chunk))
                        .expect("forward ran first");
                    let start = Instant::now();
                    let weight = precision.gradient_weight(sizes[micro]);
                    let grad =
                        stage.backward(working.as_ref(), index, chunk, state, upstream, weight)?;
                    let elapsed = stage.emulate(start.elapsed());
                    report.backward[chunk] += elapsed;
                    in_flight -= 1;
                    if let Some(grad) = grad {
                        input_grads.insert((micro, virtual_stage), grad);
                    }
                    if let Some(copies) = copies.as_mut() {
                        copies.backward_done(position, chunk, &stage);
                    }
                }
                Action::SendGradient { micro, chunk, to } => {
                    let from = schedule.virtual_stage(index, chunk);
                    let value = input_grads
                        .remove(&(micro, from))
                        .expect("sent after its backward");
                    send(&links.peers[to], Carries::Gradient, micro, from - 1, value);
                }
                Action::ReduceGradients => {
                    // One pipeline has nothing to reduce; data-parallel copies of this stage
                    // add their summed gradients.
                    if let Some(copies) = copies.as_mut() {
                        copies.finish(&mut stage, index)?;
                    }
                }
                Action::OptimizerStep => {
                    working = None; // the step is done with it
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
            if let Some(copies) = &copies {
                stage.check_copies(index, copies.worker(), data.step)?;
            }
            stage.check_tied(index, links.pipeline, data.step)?;
        }
        report.loss_scale = update.rule.loss_scale();
        if done.send(report).is_err() {
            break; // the driver stopped
        }
    }
    stage.amp = *update
        .rule
        .stats()
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Ok(stage)
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
