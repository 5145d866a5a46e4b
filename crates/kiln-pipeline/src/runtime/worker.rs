//! One stage's thread: runs its actions of the schedule, step after step.

use std::time::Duration;

use burn::optim::ModuleOptimizer;
use crossbeam_channel::{Receiver, Sender};
use kiln_comm::Communicator;
use kiln_core::Segmented;
use kiln_data::ImageBatch;
use kiln_train::{MeanGradient, Objective};

use crate::runtime::PipelineError;
use crate::runtime::checkpoint::{PartSender, hand_over};
use crate::runtime::evaluate::evaluate;
use crate::runtime::mailbox::{Mailbox, Message};
use crate::runtime::overlap::CopiesReduce;
use crate::runtime::stage::Stage;
use crate::runtime::stage_step::train_step;
use crate::schedule::Schedule;

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
        // Validation and checkpoints answer at once; a training step runs its actions.
        let report = match data.work {
            Work::Train => {
                let (trained, report) = train_step(
                    index,
                    stage,
                    (schedule, objective),
                    &mut update,
                    &mut links,
                    &mut copies,
                    &data,
                )?;
                stage = trained;
                report
            }
            Work::Evaluate => evaluate(index, (&stage, objective), schedule, &mut links, &data)?,
            Work::Save => save(index, &stage, &update, &links, data.step),
        };
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

/// Stage `index`'s answer to a checkpoint at step `step`: its part handed over (when it
/// saves), and an empty report.
fn save<M>(
    index: usize,
    stage: &Stage<M>,
    update: &Update,
    links: &Links<'_, M::Hidden>,
    step: usize,
) -> StepDone
where
    M: Segmented + 'static,
{
    if let Some(parts) = &links.parts {
        let step_state = update.rule.saved_state();
        hand_over(
            index,
            step,
            (&stage.model, &update.optimizer, step_state),
            &stage.owned_ids,
            parts,
        );
    }
    StepDone {
        thread: links.thread,
        ..StepDone::default()
    }
}
