//! The schedule type: one list of actions per stage.

use super::{Action, ScheduleError, ScheduleKind, gpipe, interleaved_1f1b, one_f_one_b};

/// What a training step runs on each pipeline stage, in order.
///
/// There are `P` stages (devices, ranks), `M` micro-batches and `v` model chunks per stage
/// (`v = 1` except for interleaved schedules), so `V = v·P` virtual stages: virtual stage
/// `c·P + d` is chunk `c` of stage `d` (the Megatron-LM and PyTorch numbering), the first
/// reads the micro-batch and the last, on stage `P − 1`, computes the loss.
///
/// Build one with [`Schedule::new`] (or [`gpipe`], [`one_f_one_b`], [`interleaved_1f1b`]),
/// or by hand with [`Schedule::from_actions`] and check it with
/// [`validate`](Schedule::validate); [`simulate`](super::simulate) dry-runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    kind: ScheduleKind,
    micro_batches: usize,
    actions: Vec<Vec<Action>>,
}

/// Which way a message travels along the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Flow {
    /// An activation, from virtual stage `s` to `s + 1`.
    Activation,
    /// An input gradient, from virtual stage `s + 1` to `s`.
    Gradient,
}

/// What pairs a send with its receive: the flow, the micro-batch and the link (named by
/// the lower of its two virtual stages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct MessageKey {
    pub flow: Flow,
    pub micro: usize,
    pub link: usize,
}

impl Schedule {
    /// Generates the schedule of `kind` for `stages` stages and `micro_batches`
    /// micro-batches.
    pub fn new(
        kind: ScheduleKind,
        stages: usize,
        micro_batches: usize,
    ) -> Result<Self, ScheduleError> {
        match kind {
            ScheduleKind::GPipe => gpipe(stages, micro_batches),
            ScheduleKind::OneFOneB => one_f_one_b(stages, micro_batches),
            ScheduleKind::Interleaved { virtual_stages } => {
                interleaved_1f1b(stages, micro_batches, virtual_stages)
            }
        }
    }

    /// A schedule from hand-written lists, one per stage, taken as they are: call
    /// [`validate`](Self::validate) to check them. `kind` says how many chunks each stage
    /// holds.
    pub fn from_actions(
        kind: ScheduleKind,
        micro_batches: usize,
        actions: Vec<Vec<Action>>,
    ) -> Self {
        Self {
            kind,
            micro_batches,
            actions,
        }
    }

    /// The family this schedule belongs to.
    pub fn kind(&self) -> ScheduleKind {
        self.kind
    }

    /// P, the number of stages (devices).
    pub fn stages(&self) -> usize {
        self.actions.len()
    }

    /// M, the number of micro-batches per step.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// v, the model chunks per stage.
    pub fn chunks(&self) -> usize {
        self.kind.chunks()
    }

    /// V = v·P, the number of virtual stages.
    pub fn virtual_stages(&self) -> usize {
        self.chunks() * self.stages()
    }

    /// The virtual stage that is chunk `chunk` of stage `stage`: `chunk · P + stage`.
    pub fn virtual_stage(&self, stage: usize, chunk: usize) -> usize {
        chunk * self.stages() + stage
    }

    /// Where virtual stage `virtual_stage` lives: `(stage, chunk)`.
    ///
    /// # Panics
    ///
    /// If the schedule has no stages.
    pub fn placement(&self, virtual_stage: usize) -> (usize, usize) {
        let stages = self.stages();
        (virtual_stage % stages, virtual_stage / stages)
    }

    /// The actions stage `stage` runs, in order.
    ///
    /// # Panics
    ///
    /// If `stage` is not below [`stages`](Self::stages).
    pub fn actions(&self, stage: usize) -> &[Action] {
        &self.actions[stage]
    }

    /// The lists of every stage, to edit or hand on.
    pub fn into_actions(self) -> Vec<Vec<Action>> {
        self.actions
    }

    /// The message a send or receive on `stage` carries, and whether it is the send; `None`
    /// for other actions, and for messages that have no link (out of the pipeline's ends).
    pub(super) fn message(&self, stage: usize, action: &Action) -> Option<(MessageKey, bool)> {
        let (flow, micro, chunk, send) = match *action {
            Action::SendActivation { micro, chunk, .. } => (Flow::Activation, micro, chunk, true),
            Action::RecvActivation { micro, chunk, .. } => (Flow::Activation, micro, chunk, false),
            Action::SendGradient { micro, chunk, .. } => (Flow::Gradient, micro, chunk, true),
            Action::RecvGradient { micro, chunk, .. } => (Flow::Gradient, micro, chunk, false),
            _ => return None,
        };
        let here = self.virtual_stage(stage, chunk);
        // The link's lower end: the sender of an activation, the receiver of a gradient.
        let link = match (flow, send) {
            (Flow::Activation, true) | (Flow::Gradient, false) => here,
            (Flow::Activation, false) | (Flow::Gradient, true) => here.checked_sub(1)?,
        };
        (link + 1 < self.virtual_stages()).then_some((MessageKey { flow, micro, link }, send))
    }
}
