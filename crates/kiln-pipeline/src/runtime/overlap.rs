//! A stage's data-parallel copies adding their gradients while the stage computes on.
//!
//! With D > 1 the copies of a stage sum their gradients before the optimizer step. A chunk's
//! gradients are final once its last micro-batch's backward has run, so with several chunks
//! per stage (interleaved 1F1B) each chunk's part of the gradient buffer goes to a
//! communication thread ([`CommWorker`]) as soon as it is final and is summed there while
//! the stage runs its other chunks' backward (and its sends and waits): the schedule's
//! `ReduceGradients` only waits for the parts and writes them back. With one chunk the part
//! is the whole buffer, sent after the last backward (it overlaps that micro-batch's
//! gradient send); chunks whose parameters overlap or leave some out fall back to that too.
//! The sum is element-wise and in rank order (`all_reduce_in_rank_order`), so the result is
//! bit for bit the single reduction's, however the buffer is cut.

use std::ops::Range;

use kiln_comm::{CommWorker, Communicator, Pending, ReduceOp};
use kiln_core::Segmented;

use crate::runtime::PipelineError;
use crate::runtime::stage::Stage;
use crate::schedule::{Action, Schedule};

/// The reduction of one stage's gradients with its copies', part by part.
pub(crate) struct CopiesReduce {
    worker: CommWorker,
    /// Per part, the ranges of the flat gradient buffer it covers.
    parts: Vec<Vec<Range<usize>>>,
    /// Per chunk, its part.
    part_of: Vec<usize>,
    /// Per chunk, the position in the stage's actions of its last backward.
    last_backward: Vec<Option<usize>>,
    /// Per part, its chunks whose last backward has not run yet this step.
    remaining: Vec<usize>,
    /// The parts submitted this step, in submission order.
    pending: Vec<(usize, Pending<Vec<f32>>)>,
}

impl CopiesReduce {
    /// The reduction of stage `index`'s gradients (of `stage`) over `replicas`, the group of
    /// its copies, following `schedule`.
    pub(crate) fn new<M: Segmented>(
        replicas: Communicator,
        stage: &Stage<M>,
        schedule: &Schedule,
        index: usize,
    ) -> Self {
        let chunks = schedule.chunks();
        let (parts, part_of) = match stage.chunk_grad_ranges() {
            Some(ranges) if ranges.len() == chunks => (ranges, (0..chunks).collect()),
            _ => (vec![vec![0..stage.grad_len()]], vec![0; chunks]),
        };
        let mut last_backward = vec![None; chunks];
        for (position, action) in schedule.actions(index).iter().enumerate() {
            if let Action::Backward { chunk, .. } = *action {
                last_backward[chunk] = Some(position);
            }
        }
        let mut reduce = Self {
            worker: CommWorker::spawn(replicas),
            parts,
            part_of,
            last_backward,
            remaining: Vec::new(),
            pending: Vec::new(),
        };
        reduce.reset();
        reduce
    }

    /// The communication thread (for the copies' other collectives, in the same order).
    pub(crate) fn worker(&self) -> &CommWorker {
        &self.worker
    }

    fn reset(&mut self) {
        self.remaining = vec![0; self.parts.len()];
        for (chunk, &part) in self.part_of.iter().enumerate() {
            if self.last_backward[chunk].is_some() {
                self.remaining[part] += 1;
            }
        }
        self.pending.clear();
    }

    /// After the backward at `position` of the stage's actions (of chunk `chunk`): submits
    /// the chunk's part once every chunk of it is final.
    pub(crate) fn backward_done<M: Segmented>(
        &mut self,
        position: usize,
        chunk: usize,
        stage: &Stage<M>,
    ) {
        if self.last_backward[chunk] != Some(position) {
            return;
        }
        let part = self.part_of[chunk];
        self.remaining[part] -= 1;
        if self.remaining[part] == 0 {
            self.submit(part, stage);
        }
    }

    fn submit<M: Segmented>(&mut self, part: usize, stage: &Stage<M>) {
        let values = stage.grads_in(&self.parts[part]);
        let pending = self.worker.submit(move |copies| {
            let mut values = values;
            copies
                .all_reduce_in_rank_order(&mut values, ReduceOp::Sum)
                .map(|_| values)
        });
        self.pending.push((part, pending));
    }

    /// At the schedule's `ReduceGradients`: submits what is left (parts of chunks without a
    /// backward), waits for every part and writes the sums into `stage`'s buffer.
    ///
    /// # Errors
    /// [`PipelineError::PeerLost`] if a copy is gone or the all-reduce times out.
    pub(crate) fn finish<M: Segmented>(
        &mut self,
        stage: &mut Stage<M>,
        index: usize,
    ) -> Result<(), PipelineError> {
        let submitted: Vec<usize> = self.pending.iter().map(|(part, _)| *part).collect();
        for part in 0..self.parts.len() {
            if !submitted.contains(&part) {
                self.submit(part, stage);
            }
        }
        let mut result = Ok(());
        for (part, pending) in std::mem::take(&mut self.pending) {
            match pending.wait() {
                Ok(summed) if result.is_ok() => {
                    stage.set_grads_in(&self.parts[part], &summed.value)
                }
                Ok(_) => {}
                Err(err) if result.is_ok() => {
                    result = Err(PipelineError::PeerLost {
                        stage: index,
                        what: format!("the gradients of its data-parallel copies ({err})"),
                    });
                }
                Err(_) => {}
            }
        }
        self.reset();
        result
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;
    use kiln_comm::InProcessGroup;
    use kiln_core::Segmented;

    use super::CopiesReduce;
    use crate::runtime::stage::Stage;
    use crate::runtime::test_support::resnet;
    use crate::runtime::tied::StageTies;
    use crate::schedule::{Action, Schedule, ScheduleKind};

    /// With two chunks per stage (interleaved 1F1B), the first chunk to finish has its part
    /// summed while the other chunk's backward still runs, and the parts together are the
    /// whole buffer, written back unchanged by a group of one copy.
    #[test]
    fn a_finished_chunk_is_summed_before_the_stage_reduces() {
        let model = resnet(&Device::flex().autodiff(), 3);
        let segments = model.segments().len();
        // Stage 0 of 2 with 2 chunks: virtual stages 0 and 2 of 4.
        let quarter = segments / 4;
        let mut stage = Stage::new(
            model,
            vec![0..quarter, 2 * quarter..3 * quarter],
            StageTies::default(),
        );
        let ranges = stage
            .chunk_grad_ranges()
            .expect("ResNet's chunks own disjoint parameters");
        assert_eq!(ranges.len(), 2);
        let covered: usize = ranges.iter().flatten().map(|r| r.len()).sum();
        assert_eq!(covered, stage.grad_len());
        let whole = std::iter::once(0..stage.grad_len()).collect::<Vec<_>>();
        let values: Vec<f32> = (0..stage.grad_len()).map(|i| i as f32 * 0.5).collect();
        stage.set_grads_in(&whole, &values);

        let schedule =
            Schedule::new(ScheduleKind::Interleaved { virtual_stages: 2 }, 2, 4).unwrap();
        let copy = InProcessGroup::new(1).build().pop().unwrap();
        let mut reduce = CopiesReduce::new(copy, &stage, &schedule, 0);
        let mut submitted_at = Vec::new();
        let mut backwards_after_first = 0;
        for (position, action) in schedule.actions(0).iter().enumerate() {
            if let Action::Backward { chunk, .. } = *action {
                if !submitted_at.is_empty() {
                    backwards_after_first += 1;
                }
                reduce.backward_done(position, chunk, &stage);
                if reduce.pending.len() > submitted_at.len() {
                    submitted_at.push(position);
                }
            }
        }
        assert_eq!(submitted_at.len(), 2, "each chunk's part once");
        assert!(
            backwards_after_first > 0,
            "the first part went before the last backward"
        );
        reduce.finish(&mut stage, 0).unwrap();
        assert_eq!(stage.grads_in(&whole), values);
    }
}
