//! Validation through the pipeline: each stage runs its chunks forward on an inference copy
//! of its module, micro-batch after micro-batch, passing activations on; the last virtual
//! stage scores them. Every stage takes (micro-batch, virtual stage) in increasing order and
//! each waits only for a smaller virtual stage of the same micro-batch, so it cannot
//! deadlock, whatever the schedule's interleaving.

use kiln_core::Segmented;
use kiln_data::Batch;
use kiln_train::Objective;

use crate::runtime::PipelineError;
use crate::runtime::mailbox::{Carries, Message};
use crate::runtime::stage::{Evaluated, Input, Stage};
use crate::runtime::worker::{Links, StepData, StepDone};
use crate::schedule::Schedule;

/// Stage `index`'s part of evaluating `data`'s micro-batches for `objective`: the loss
/// summed over samples and the correct count, on the stage holding the model's last segment.
pub(crate) fn evaluate<M, O>(
    index: usize,
    (stage, objective): (&Stage<M>, &O),
    schedule: &Schedule,
    links: &mut Links<'_, M::Hidden>,
    data: &StepData<O::Batch>,
) -> Result<StepDone, PipelineError>
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output>,
{
    let model = stage.model.valid();
    let (stages, last) = (schedule.stages(), schedule.virtual_stages() - 1);
    let mut report = StepDone {
        thread: links.thread,
        ..StepDone::default()
    };
    for (micro, batch) in data.micro_batches.iter().enumerate() {
        // The output of this stage's previous chunk, when the next virtual stage is its own.
        let mut kept = None;
        for chunk in 0..schedule.chunks() {
            let virtual_stage = schedule.virtual_stage(index, chunk);
            let input = if virtual_stage == 0 {
                Input::Model(Box::new(objective.input(batch)))
            } else if let Some(hidden) = kept.take() {
                Input::Hidden(hidden)
            } else {
                Input::Hidden(
                    links
                        .mailbox
                        .take(Carries::Activation, micro, virtual_stage)?,
                )
            };
            let targets = (virtual_stage == last).then_some(batch);
            match stage.evaluate((&model, objective), chunk, input, targets) {
                Evaluated::Scored { loss, correct } => {
                    report.loss_sum += f64::from(loss) * batch.samples() as f64;
                    report.correct += correct;
                }
                Evaluated::Hidden(hidden) => {
                    let to = (virtual_stage + 1) % stages;
                    if to == index {
                        kept = Some(hidden);
                    } else {
                        // A peer that is gone shows up as its own error on the driver.
                        let _ = links.peers[to].send(Message {
                            carries: Carries::Activation,
                            micro,
                            to: virtual_stage + 1,
                            value: hidden,
                        });
                    }
                }
            }
        }
    }
    Ok(report)
}
