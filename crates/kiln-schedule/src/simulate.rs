//! The simulator: runs a schedule's lists abstractly, with given compute times, to time it
//! and to find deadlocks before anything runs.

use std::collections::HashMap;

use super::{Action, BlockedAction, Schedule, ScheduleError};

/// Durations for [`simulate`], in any one unit of time.
#[derive(Debug, Clone, PartialEq)]
pub struct Costs {
    forward: PerStage,
    backward: PerStage,
    transfer: f64,
}

#[derive(Debug, Clone, PartialEq)]
enum PerStage {
    Uniform(f64),
    Each(Vec<f64>),
}

impl PerStage {
    fn get(&self, virtual_stage: usize) -> f64 {
        match self {
            Self::Uniform(time) => *time,
            Self::Each(times) => times[virtual_stage],
        }
    }

    fn check(&self, what: &str, virtual_stages: usize) -> Result<(), ScheduleError> {
        let times = match self {
            Self::Uniform(time) => std::slice::from_ref(time),
            Self::Each(times) if times.len() != virtual_stages => {
                return Err(ScheduleError::InvalidCosts(format!(
                    "{what} times are given for {} virtual stages, the schedule has \
                     {virtual_stages}",
                    times.len()
                )));
            }
            Self::Each(times) => times,
        };
        match times.iter().position(|t| !(t.is_finite() && *t >= 0.0)) {
            Some(at) => Err(ScheduleError::InvalidCosts(format!(
                "{what} time of virtual stage {at} is {}; times must be finite and not \
                 negative",
                times[at]
            ))),
            None => Ok(()),
        }
    }
}

impl Costs {
    /// The same forward and backward time on every virtual stage, and instant transfers.
    pub fn uniform(forward: f64, backward: f64) -> Self {
        Self {
            forward: PerStage::Uniform(forward),
            backward: PerStage::Uniform(backward),
            transfer: 0.0,
        }
    }

    /// Forward and backward times of each virtual stage (indexed `0..V`), and instant
    /// transfers.
    pub fn per_virtual_stage(forward: Vec<f64>, backward: Vec<f64>) -> Self {
        Self {
            forward: PerStage::Each(forward),
            backward: PerStage::Each(backward),
            transfer: 0.0,
        }
    }

    /// The same costs, with every message arriving `transfer` after it is sent (senders do
    /// not wait).
    pub fn with_transfer(self, transfer: f64) -> Self {
        Self { transfer, ..self }
    }

    /// The forward time of `virtual_stage`.
    ///
    /// # Panics
    ///
    /// If the costs are per virtual stage and `virtual_stage` is out of their range.
    pub fn forward(&self, virtual_stage: usize) -> f64 {
        self.forward.get(virtual_stage)
    }

    /// The backward time of `virtual_stage`.
    ///
    /// # Panics
    ///
    /// If the costs are per virtual stage and `virtual_stage` is out of their range.
    pub fn backward(&self, virtual_stage: usize) -> f64 {
        self.backward.get(virtual_stage)
    }

    /// The time from a send to its message's arrival.
    pub fn transfer(&self) -> f64 {
        self.transfer
    }

    fn check(&self, virtual_stages: usize) -> Result<(), ScheduleError> {
        self.forward.check("forward", virtual_stages)?;
        self.backward.check("backward", virtual_stages)?;
        if !(self.transfer.is_finite() && self.transfer >= 0.0) {
            return Err(ScheduleError::InvalidCosts(format!(
                "transfer time is {}; it must be finite and not negative",
                self.transfer
            )));
        }
        Ok(())
    }
}

/// When one action ran: from `start` to `end` (equal for instant actions; for a receive,
/// the time spent waiting for its message).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// When the stage reached the action.
    pub start: f64,
    /// When the action finished.
    pub end: f64,
}

/// The result of [`simulate`]: when each action ran, and what that says about the step.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    spans: Vec<Vec<Span>>,
    busy: Vec<f64>,
    peak_in_flight: Vec<usize>,
    step_time: f64,
}

impl Timeline {
    /// When each action of `stage` ran, in the stage's order.
    ///
    /// # Panics
    ///
    /// If `stage` is out of range.
    pub fn spans(&self, stage: usize) -> &[Span] {
        &self.spans[stage]
    }

    /// The number of stages.
    pub fn stages(&self) -> usize {
        self.spans.len()
    }

    /// The makespan: when the last action of any stage ends (the step starts at 0).
    pub fn step_time(&self) -> f64 {
        self.step_time
    }

    /// The time `stage` spends in forwards and backwards.
    ///
    /// # Panics
    ///
    /// If `stage` is out of range.
    pub fn busy_time(&self, stage: usize) -> f64 {
        self.busy[stage]
    }

    /// The time `stage` spends not computing within the step: `step_time − busy_time`.
    ///
    /// # Panics
    ///
    /// If `stage` is out of range.
    pub fn idle_time(&self, stage: usize) -> f64 {
        self.step_time - self.busy[stage]
    }

    /// The bubble: idle time ÷ step time, averaged over the stages (0 for an empty step).
    pub fn bubble_fraction(&self) -> f64 {
        if self.step_time <= 0.0 {
            return 0.0;
        }
        let idle: f64 = (0..self.stages()).map(|s| self.idle_time(s)).sum();
        idle / (self.step_time * self.stages() as f64)
    }

    /// The most (micro-batch, chunk) pairs `stage` holds activations for at once: forwarded
    /// but not yet backwarded, over all its chunks (without interleaving, micro-batches).
    ///
    /// # Panics
    ///
    /// If `stage` is out of range.
    pub fn peak_in_flight(&self, stage: usize) -> usize {
        self.peak_in_flight[stage]
    }
}

/// Runs `schedule` abstractly: each stage runs its actions in order; forwards and backwards
/// take their [`Costs`]; a send is instant and does not wait (its message arrives after the
/// transfer time); a receive waits for its message; `ReduceGradients` and `OptimizerStep`
/// are instant.
///
/// The schedule is [validated](Schedule::validate) first. If no stage can move before all
/// have finished, the result is [`ScheduleError::Deadlock`] naming each stuck stage's
/// receive.
pub fn simulate(schedule: &Schedule, costs: &Costs) -> Result<Timeline, ScheduleError> {
    schedule.validate()?;
    costs.check(schedule.virtual_stages())?;
    let stages = schedule.stages();
    let mut next = vec![0; stages];
    let mut clock = vec![0.0_f64; stages];
    let mut spans: Vec<Vec<Span>> = (0..stages)
        .map(|stage| Vec::with_capacity(schedule.actions(stage).len()))
        .collect();
    let mut arrivals = HashMap::new();
    // Sends never wait, so each stage's times depend only on its own list and the arrivals
    // it waits for: running stages in any order gives the same timeline.
    loop {
        let mut moved = false;
        for stage in 0..stages {
            while let Some(action) = schedule.actions(stage).get(next[stage]) {
                let start = clock[stage];
                let here = |chunk| schedule.virtual_stage(stage, chunk);
                let end = match *action {
                    Action::Forward { chunk, .. } => start + costs.forward(here(chunk)),
                    Action::Backward { chunk, .. } => start + costs.backward(here(chunk)),
                    Action::SendActivation { .. }
                    | Action::SendGradient { .. }
                    | Action::RecvActivation { .. }
                    | Action::RecvGradient { .. } => {
                        let Some((key, send)) = schedule.message(stage, action) else {
                            unreachable!("a validated message has a link");
                        };
                        if send {
                            arrivals.insert(key, start + costs.transfer());
                            start
                        } else {
                            match arrivals.get(&key) {
                                Some(&arrival) => start.max(arrival),
                                None => break,
                            }
                        }
                    }
                    Action::ReduceGradients | Action::OptimizerStep => start,
                };
                spans[stage].push(Span { start, end });
                clock[stage] = end;
                next[stage] += 1;
                moved = true;
            }
        }
        let done = (0..stages).all(|stage| next[stage] == schedule.actions(stage).len());
        if done {
            break;
        }
        if !moved {
            let blocked = (0..stages)
                .filter_map(|stage| {
                    let index = next[stage];
                    let action = *schedule.actions(stage).get(index)?;
                    Some(BlockedAction {
                        stage,
                        index,
                        action,
                    })
                })
                .collect();
            return Err(ScheduleError::Deadlock { blocked });
        }
    }
    let busy = (0..stages)
        .map(|stage| {
            let actions = schedule.actions(stage);
            let compute = actions
                .iter()
                .zip(&spans[stage])
                .filter(|(a, _)| a.is_compute());
            compute.map(|(_, span)| span.end - span.start).sum()
        })
        .collect();
    let peak_in_flight = (0..stages)
        .map(|stage| {
            let mut held = 0_usize;
            let mut peak = 0;
            for action in schedule.actions(stage) {
                match action {
                    Action::Forward { .. } => held += 1,
                    Action::Backward { .. } => held = held.saturating_sub(1),
                    _ => {}
                }
                peak = peak.max(held);
            }
            peak
        })
        .collect();
    let step_time = spans.iter().flatten().map(|s| s.end).fold(0.0, f64::max);
    Ok(Timeline {
        spans,
        busy,
        peak_in_flight,
        step_time,
    })
}
