//! The validator: whether every stage's list is a complete, consistent step on its own, and
//! every message has exactly one sender and one receiver.
//!
//! It checks what each stage can see locally; whether the stages, run together, make
//! progress is the simulator's question ([`simulate`](super::simulate) reports a deadlock).

use std::collections::HashMap;

use super::base::MessageKey;
use super::{Action, Schedule, ScheduleError};

impl Schedule {
    /// Checks the schedule, returning the first problem found:
    ///
    /// - the shape suits the kind (see [`ScheduleKind::check`](super::ScheduleKind::check));
    /// - every micro-batch and chunk is in range, and every send and receive names the
    ///   stage holding the neighbouring virtual stage (never its own stage: hand-overs
    ///   between chunks of one stage are not messages);
    /// - every send is matched by exactly one receive on its peer, and every receive by
    ///   exactly one send;
    /// - on each stage, every (chunk, micro-batch) is forwarded once and backwarded once,
    ///   the forward first; a forward's input (a receive, or the previous chunk's forward on
    ///   the same stage) and a backward's output gradient (likewise) come before it, and a
    ///   send comes after the compute producing what it sends;
    /// - each stage ends with `ReduceGradients` once, after all its compute, then
    ///   `OptimizerStep` once.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        self.kind().check(self.stages(), self.micro_batches())?;
        for stage in 0..self.stages() {
            for (index, action) in self.actions(stage).iter().enumerate() {
                self.check_action(stage, action)
                    .map_err(|problem| invalid(stage, index, *action, problem))?;
            }
        }
        self.check_pairs()?;
        (0..self.stages()).try_for_each(|stage| self.check_stage(stage))
    }

    /// Ranges and peers of one action.
    fn check_action(&self, stage: usize, action: &Action) -> Result<(), String> {
        let (micro, chunk) = match (action.micro(), action.chunk()) {
            (Some(micro), Some(chunk)) => (micro, chunk),
            _ => return Ok(()),
        };
        if micro >= self.micro_batches() {
            return Err(format!(
                "micro-batch {micro} is out of range: the step has {} micro-batches",
                self.micro_batches()
            ));
        }
        if chunk >= self.chunks() {
            return Err(format!(
                "chunk {chunk} is out of range: each stage holds {} chunk(s)",
                self.chunks()
            ));
        }
        let here = self.virtual_stage(stage, chunk);
        let last = self.virtual_stages() - 1;
        let (peer, neighbour) = match *action {
            Action::SendActivation { .. } if here == last => {
                return Err(
                    "the last virtual stage computes the loss and sends no activation".to_string(),
                );
            }
            Action::SendActivation { to, .. } => (to, here + 1),
            Action::RecvActivation { .. } if here == 0 => {
                return Err(
                    "the first virtual stage reads the micro-batch and receives no \
                            activation"
                        .to_string(),
                );
            }
            Action::RecvActivation { from, .. } => (from, here - 1),
            Action::SendGradient { .. } if here == 0 => {
                return Err(
                    "the first virtual stage has no predecessor to send a gradient to".to_string(),
                );
            }
            Action::SendGradient { to, .. } => (to, here - 1),
            Action::RecvGradient { .. } if here == last => {
                return Err("the last virtual stage starts backward from the loss and \
                            receives no gradient"
                    .to_string());
            }
            Action::RecvGradient { from, .. } => (from, here + 1),
            _ => return Ok(()),
        };
        let (expected, _) = self.placement(neighbour);
        if expected == stage {
            return Err(format!(
                "virtual stage {neighbour} is on this same stage: hand-overs between chunks \
                 of one stage are not messages"
            ));
        }
        if peer != expected {
            return Err(format!(
                "virtual stage {neighbour}, at the other end, is on stage {expected}, not \
                 stage {peer}"
            ));
        }
        Ok(())
    }

    /// Every send has one receive, and every receive one send.
    fn check_pairs(&self) -> Result<(), ScheduleError> {
        type Ends = HashMap<MessageKey, Vec<(usize, usize)>>;
        let mut sends = Ends::new();
        let mut recvs = Ends::new();
        for stage in 0..self.stages() {
            for (index, action) in self.actions(stage).iter().enumerate() {
                if let Some((key, send)) = self.message(stage, action) {
                    let ends = if send { &mut sends } else { &mut recvs };
                    ends.entry(key).or_default().push((stage, index));
                }
            }
        }
        for stage in 0..self.stages() {
            for (index, action) in self.actions(stage).iter().enumerate() {
                let Some((key, send)) = self.message(stage, action) else {
                    continue;
                };
                let (mine, theirs) = if send {
                    (&sends[&key], recvs.get(&key).map_or(0, Vec::len))
                } else {
                    (&recvs[&key], sends.get(&key).map_or(0, Vec::len))
                };
                // The n-th send of a message pairs with its n-th receive.
                let nth = mine
                    .iter()
                    .position(|&end| end == (stage, index))
                    .unwrap_or(0);
                let (verb, other) = if send {
                    ("sent", "receive")
                } else {
                    ("received", "send")
                };
                let earlier = |(s, i): (usize, usize)| {
                    format!("it is already {verb} at stage {s}, action {i}")
                };
                let problem = if nth >= theirs {
                    let peer = action.peer().unwrap_or_default();
                    let mut problem = format!("no matching {other} on stage {peer}");
                    if nth > 0 {
                        problem = format!("{problem} ({})", earlier(mine[0]));
                    }
                    problem
                } else if nth > 0 {
                    format!("{verb} twice: {}", earlier(mine[0]))
                } else {
                    continue;
                };
                return Err(invalid(stage, index, *action, problem));
            }
        }
        Ok(())
    }

    /// The order of one stage's list, and its completeness.
    fn check_stage(&self, stage: usize) -> Result<(), ScheduleError> {
        let mut order = StageOrder::new(self, stage);
        for (index, action) in self.actions(stage).iter().enumerate() {
            order
                .record(index, action)
                .map_err(|problem| invalid(stage, index, *action, problem))?;
        }
        match order.missing() {
            Some(action) => Err(ScheduleError::MissingAction { stage, action }),
            None => Ok(()),
        }
    }
}

/// What one stage's list has run so far, action by action: where each (chunk, micro-batch)
/// was forwarded and backwarded, which inputs arrived, and where the step's end ran.
struct StageOrder<'a> {
    schedule: &'a Schedule,
    stage: usize,
    /// Per (chunk, micro-batch) slot, the action that forwarded it.
    forward: Vec<Option<usize>>,
    /// Per slot, the action that backwarded it.
    backward: Vec<Option<usize>>,
    /// Per slot, whether its input activation was received.
    recv_activation: Vec<bool>,
    /// Per slot, whether its output gradient was received.
    recv_gradient: Vec<bool>,
    /// The action that reduced the gradients.
    reduce: Option<usize>,
    /// The action that stepped the optimizer.
    step: Option<usize>,
    /// One stage holds every chunk: its hand-overs between chunks replace the messages.
    shared: bool,
    /// The last virtual stage.
    last: usize,
}

impl<'a> StageOrder<'a> {
    /// Nothing run yet on `stage`.
    fn new(schedule: &'a Schedule, stage: usize) -> Self {
        let cells = schedule.chunks() * schedule.micro_batches();
        Self {
            schedule,
            stage,
            forward: vec![None; cells],
            backward: vec![None; cells],
            recv_activation: vec![false; cells],
            recv_gradient: vec![false; cells],
            reduce: None,
            step: None,
            shared: schedule.stages() == 1,
            last: schedule.virtual_stages() - 1,
        }
    }

    /// Where micro-batch `micro` of chunk `chunk` sits in the per-slot lists.
    fn slot(&self, micro: usize, chunk: usize) -> usize {
        chunk * self.schedule.micro_batches() + micro
    }

    /// Records action `index`, or says why it is out of order.
    fn record(&mut self, index: usize, action: &Action) -> Result<(), String> {
        if let (true, Some(done)) = (action.is_compute(), self.reduce) {
            return Err(format!(
                "runs after reduce gradients (action {done}): all compute must finish \
                 before the gradients are reduced"
            ));
        }
        match *action {
            Action::Forward { micro, chunk } => self.forward(index, micro, chunk),
            Action::Backward { micro, chunk } => self.backward(index, micro, chunk),
            Action::SendActivation { micro, chunk, .. } => {
                if self.forward[self.slot(micro, chunk)].is_none() {
                    return Err("comes before the forward that produces it".to_string());
                }
                Ok(())
            }
            Action::SendGradient { micro, chunk, .. } => {
                if self.backward[self.slot(micro, chunk)].is_none() {
                    return Err("comes before the backward that produces it".to_string());
                }
                Ok(())
            }
            Action::RecvActivation { micro, chunk, .. } => {
                let slot = self.slot(micro, chunk);
                self.recv_activation[slot] = true;
                Ok(())
            }
            Action::RecvGradient { micro, chunk, .. } => {
                let slot = self.slot(micro, chunk);
                self.recv_gradient[slot] = true;
                Ok(())
            }
            Action::ReduceGradients => self.reduce(index),
            Action::OptimizerStep => self.optimizer_step(index),
        }
    }

    /// Records forward `index` of micro-batch `micro` on chunk `chunk`, once its input is here.
    fn forward(&mut self, index: usize, micro: usize, chunk: usize) -> Result<(), String> {
        let here = self.schedule.virtual_stage(self.stage, chunk);
        let slot = self.slot(micro, chunk);
        if let Some(first) = self.forward[slot] {
            return Err(format!("forwarded twice (first at action {first})"));
        }
        if here > 0 && self.shared && self.forward[self.slot(micro, chunk - 1)].is_none() {
            return Err(format!(
                "its input comes from forward of micro-batch {micro} on chunk {}, \
                 which has not run yet on this stage",
                chunk - 1
            ));
        }
        if here > 0 && !self.shared && !self.recv_activation[slot] {
            let (from, _) = self.schedule.placement(here - 1);
            return Err(format!(
                "its input activation has not been received: no recv activation \
                 of micro-batch {micro} from stage {from} comes before it"
            ));
        }
        self.forward[slot] = Some(index);
        Ok(())
    }

    /// Records backward `index` of micro-batch `micro` on chunk `chunk`, once its forward ran
    /// and its output gradient is here.
    fn backward(&mut self, index: usize, micro: usize, chunk: usize) -> Result<(), String> {
        let here = self.schedule.virtual_stage(self.stage, chunk);
        let slot = self.slot(micro, chunk);
        if let Some(first) = self.backward[slot] {
            return Err(format!("backwarded twice (first at action {first})"));
        }
        if self.forward[slot].is_none() {
            return Err(format!(
                "runs before the forward of micro-batch {micro} on this stage"
            ));
        }
        if here < self.last && self.shared && self.backward[self.slot(micro, chunk + 1)].is_none() {
            return Err(format!(
                "its output gradient comes from backward of micro-batch {micro} \
                 on chunk {}, which has not run yet on this stage",
                chunk + 1
            ));
        }
        if here < self.last && !self.shared && !self.recv_gradient[slot] {
            let (from, _) = self.schedule.placement(here + 1);
            return Err(format!(
                "its output gradient has not been received: no recv gradient of \
                 micro-batch {micro} from stage {from} comes before it"
            ));
        }
        self.backward[slot] = Some(index);
        Ok(())
    }

    /// Records the gradients' reduction at action `index`, once and before the optimizer step.
    fn reduce(&mut self, index: usize) -> Result<(), String> {
        if let Some(first) = self.reduce {
            return Err(format!("runs twice (first at action {first})"));
        }
        if let Some(done) = self.step {
            return Err(format!("runs after the optimizer step (action {done})"));
        }
        self.reduce = Some(index);
        Ok(())
    }

    /// Records the optimizer step at action `index`, once and after the reduction.
    fn optimizer_step(&mut self, index: usize) -> Result<(), String> {
        if let Some(first) = self.step {
            return Err(format!("runs twice (first at action {first})"));
        }
        if self.reduce.is_none() {
            return Err(
                "runs before reduce gradients: it would apply unreduced gradients".to_string(),
            );
        }
        self.step = Some(index);
        Ok(())
    }

    /// The first action the list lacks, once all of it is recorded.
    fn missing(&self) -> Option<Action> {
        for chunk in 0..self.schedule.chunks() {
            for micro in 0..self.schedule.micro_batches() {
                if self.forward[self.slot(micro, chunk)].is_none() {
                    return Some(Action::Forward { micro, chunk });
                }
                if self.backward[self.slot(micro, chunk)].is_none() {
                    return Some(Action::Backward { micro, chunk });
                }
            }
        }
        if self.reduce.is_none() {
            return Some(Action::ReduceGradients);
        }
        if self.step.is_none() {
            return Some(Action::OptimizerStep);
        }
        None
    }
}

/// The error of action `index` of `stage`'s list, for `problem`.
fn invalid(stage: usize, index: usize, action: Action, problem: String) -> ScheduleError {
    ScheduleError::InvalidAction {
        stage,
        index,
        action,
        problem,
    }
}
