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
        let micro_batches = self.micro_batches();
        let chunks = self.chunks();
        let cells = chunks * micro_batches;
        let slot = |micro: usize, chunk: usize| chunk * micro_batches + micro;
        let mut forward = vec![None; cells];
        let mut backward = vec![None; cells];
        let mut recv_activation = vec![false; cells];
        let mut recv_gradient = vec![false; cells];
        let mut reduce = None;
        let mut step = None;
        let shared = self.stages() == 1;
        let last = self.virtual_stages() - 1;
        for (index, action) in self.actions(stage).iter().enumerate() {
            let fail = |problem: String| Err(invalid(stage, index, *action, problem));
            if let (true, Some(done)) = (action.is_compute(), reduce) {
                return fail(format!(
                    "runs after reduce gradients (action {done}): all compute must finish \
                     before the gradients are reduced"
                ));
            }
            match *action {
                Action::Forward { micro, chunk } => {
                    let here = self.virtual_stage(stage, chunk);
                    if let Some(first) = forward[slot(micro, chunk)] {
                        return fail(format!("forwarded twice (first at action {first})"));
                    }
                    if here > 0 && shared && forward[slot(micro, chunk - 1)].is_none() {
                        return fail(format!(
                            "its input comes from forward of micro-batch {micro} on chunk {}, \
                             which has not run yet on this stage",
                            chunk - 1
                        ));
                    }
                    if here > 0 && !shared && !recv_activation[slot(micro, chunk)] {
                        let (from, _) = self.placement(here - 1);
                        return fail(format!(
                            "its input activation has not been received: no recv activation \
                             of micro-batch {micro} from stage {from} comes before it"
                        ));
                    }
                    forward[slot(micro, chunk)] = Some(index);
                }
                Action::Backward { micro, chunk } => {
                    let here = self.virtual_stage(stage, chunk);
                    if let Some(first) = backward[slot(micro, chunk)] {
                        return fail(format!("backwarded twice (first at action {first})"));
                    }
                    if forward[slot(micro, chunk)].is_none() {
                        return fail(format!(
                            "runs before the forward of micro-batch {micro} on this stage"
                        ));
                    }
                    if here < last && shared && backward[slot(micro, chunk + 1)].is_none() {
                        return fail(format!(
                            "its output gradient comes from backward of micro-batch {micro} \
                             on chunk {}, which has not run yet on this stage",
                            chunk + 1
                        ));
                    }
                    if here < last && !shared && !recv_gradient[slot(micro, chunk)] {
                        let (from, _) = self.placement(here + 1);
                        return fail(format!(
                            "its output gradient has not been received: no recv gradient of \
                             micro-batch {micro} from stage {from} comes before it"
                        ));
                    }
                    backward[slot(micro, chunk)] = Some(index);
                }
                Action::SendActivation { micro, chunk, .. } => {
                    if forward[slot(micro, chunk)].is_none() {
                        return fail("comes before the forward that produces it".to_string());
                    }
                }
                Action::SendGradient { micro, chunk, .. } => {
                    if backward[slot(micro, chunk)].is_none() {
                        return fail("comes before the backward that produces it".to_string());
                    }
                }
                Action::RecvActivation { micro, chunk, .. } => {
                    recv_activation[slot(micro, chunk)] = true;
                }
                Action::RecvGradient { micro, chunk, .. } => {
                    recv_gradient[slot(micro, chunk)] = true;
                }
                Action::ReduceGradients => {
                    if let Some(first) = reduce {
                        return fail(format!("runs twice (first at action {first})"));
                    }
                    if let Some(done) = step {
                        return fail(format!("runs after the optimizer step (action {done})"));
                    }
                    reduce = Some(index);
                }
                Action::OptimizerStep => {
                    if let Some(first) = step {
                        return fail(format!("runs twice (first at action {first})"));
                    }
                    if reduce.is_none() {
                        return fail(
                            "runs before reduce gradients: it would apply unreduced gradients"
                                .to_string(),
                        );
                    }
                    step = Some(index);
                }
            }
        }
        let missing = |action| Err(ScheduleError::MissingAction { stage, action });
        for chunk in 0..chunks {
            for micro in 0..micro_batches {
                if forward[slot(micro, chunk)].is_none() {
                    return missing(Action::Forward { micro, chunk });
                }
                if backward[slot(micro, chunk)].is_none() {
                    return missing(Action::Backward { micro, chunk });
                }
            }
        }
        if reduce.is_none() {
            return missing(Action::ReduceGradients);
        }
        if step.is_none() {
            return missing(Action::OptimizerStep);
        }
        Ok(())
    }
}

fn invalid(stage: usize, index: usize, action: Action, problem: String) -> ScheduleError {
    ScheduleError::InvalidAction {
        stage,
        index,
        action,
        problem,
    }
}
