//! The generators: each decides the order of forwards and backwards on every stage, and one
//! lowering pass adds what that order implies (sends, receives, the end-of-step actions).

use super::{Action, Schedule, ScheduleError, ScheduleKind};

/// A forward or backward of one micro-batch through one chunk, before lowering.
#[derive(Debug, Clone, Copy)]
enum Compute {
    Forward { micro: usize, chunk: usize },
    Backward { micro: usize, chunk: usize },
}

/// GPipe (PyTorch's `ScheduleGPipe`): on every stage, the forwards of micro-batches
/// `0..M`, then their backwards in the same order `0..M`.
pub fn gpipe(stages: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    let kind = ScheduleKind::GPipe;
    kind.check(stages, micro_batches)?;
    let orders = (0..stages)
        .map(|_| warm_up_then_alternate(micro_batches, micro_batches, |k| (k, 0), |k| (k, 0)))
        .collect();
    Ok(lower(kind, stages, micro_batches, orders))
}

/// 1F1B (PyTorch's `Schedule1F1B`): stage `i` runs `min(P − i − 1, M)` warm-up forwards,
/// then alternates one forward and one backward, then runs the remaining backwards; so it
/// keeps at most `P − i` micro-batches in flight. Needs `M ≥ P`.
pub fn one_f_one_b(stages: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    let kind = ScheduleKind::OneFOneB;
    kind.check(stages, micro_batches)?;
    let orders = (0..stages)
        .map(|stage| {
            let warm_up = (stages - stage - 1).min(micro_batches);
            warm_up_then_alternate(micro_batches, warm_up, |k| (k, 0), |k| (k, 0))
        })
        .collect();
    Ok(lower(kind, stages, micro_batches, orders))
}

/// Interleaved 1F1B (Megatron-LM's `forward_backward_pipelining_with_interleaving`, with
/// micro-batch groups of `P`): each stage runs `v·M` forwards and as many backwards.
/// The `k`-th forward of a stage is micro-batch `⌊k / vP⌋·P + k mod P` on chunk
/// `⌊k / P⌋ mod v` (groups of `P` micro-batches go through chunk 0, then chunk 1, …); the
/// `k`-th backward is the same micro-batch on chunk `v − 1 − (⌊k / P⌋ mod v)`. Stage `d`
/// runs `min((v − 1)·P + 2·(P − d − 1), v·M)` warm-up forwards, then alternates one forward
/// and one backward, then runs the remaining backwards. Needs `v ≥ 2` and `M` a multiple
/// of `P`.
pub fn interleaved_1f1b(
    stages: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    let kind = ScheduleKind::Interleaved { virtual_stages };
    kind.check(stages, micro_batches)?;
    let chunks = virtual_stages;
    let round = stages * chunks;
    let micro = move |k: usize| (k / round) * stages + k % stages;
    let forward = move |k: usize| (micro(k), (k / stages) % chunks);
    let backward = move |k: usize| (micro(k), chunks - 1 - (k / stages) % chunks);
    let total = chunks * micro_batches;
    let orders = (0..stages)
        .map(|stage| {
            let warm_up = ((chunks - 1) * stages + 2 * (stages - stage - 1)).min(total);
            warm_up_then_alternate(total, warm_up, forward, backward)
        })
        .collect();
    Ok(lower(kind, stages, micro_batches, orders))
}

/// `warm_up` forwards, then one forward and one backward until the forwards run out, then
/// the remaining backwards; `forward(k)` and `backward(k)` give the `(micro, chunk)` of the
/// `k`-th of each, for `k` in `0..total`.
fn warm_up_then_alternate(
    total: usize,
    warm_up: usize,
    forward: impl Fn(usize) -> (usize, usize),
    backward: impl Fn(usize) -> (usize, usize),
) -> Vec<Compute> {
    let forward = |k| {
        let (micro, chunk) = forward(k);
        Compute::Forward { micro, chunk }
    };
    let backward = |k| {
        let (micro, chunk) = backward(k);
        Compute::Backward { micro, chunk }
    };
    let steady = total - warm_up;
    let mut order = Vec::with_capacity(2 * total);
    order.extend((0..warm_up).map(forward));
    for k in 0..steady {
        order.push(forward(k + warm_up));
        order.push(backward(k));
    }
    order.extend((steady..total).map(backward));
    order
}

/// Turns each stage's compute order into its action list: a receive right before each
/// compute that needs a tensor from another stage, a send right after each compute whose
/// result another stage needs, and `ReduceGradients`, `OptimizerStep` at the end.
///
/// # Panics
///
/// In debug builds, if the result does not validate (a bug in a generator).
fn lower(
    kind: ScheduleKind,
    stages: usize,
    micro_batches: usize,
    orders: Vec<Vec<Compute>>,
) -> Schedule {
    let last = kind.chunks() * stages - 1;
    let device = |virtual_stage: usize| virtual_stage % stages;
    let actions = orders
        .into_iter()
        .enumerate()
        .map(|(stage, order)| {
            let mut actions = Vec::with_capacity(3 * order.len() + 2);
            for compute in order {
                match compute {
                    Compute::Forward { micro, chunk } => {
                        let here = chunk * stages + stage;
                        if here > 0 && device(here - 1) != stage {
                            let from = device(here - 1);
                            actions.push(Action::RecvActivation { micro, chunk, from });
                        }
                        actions.push(Action::Forward { micro, chunk });
                        if here < last && device(here + 1) != stage {
                            let to = device(here + 1);
                            actions.push(Action::SendActivation { micro, chunk, to });
                        }
                    }
                    Compute::Backward { micro, chunk } => {
                        let here = chunk * stages + stage;
                        if here < last && device(here + 1) != stage {
                            let from = device(here + 1);
                            actions.push(Action::RecvGradient { micro, chunk, from });
                        }
                        actions.push(Action::Backward { micro, chunk });
                        if here > 0 && device(here - 1) != stage {
                            let to = device(here - 1);
                            actions.push(Action::SendGradient { micro, chunk, to });
                        }
                    }
                }
            }
            actions.push(Action::ReduceGradients);
            actions.push(Action::OptimizerStep);
            actions
        })
        .collect();
    let schedule = Schedule::from_actions(kind, micro_batches, actions);
    if cfg!(debug_assertions)
        && let Err(error) = schedule.validate()
    {
        panic!("the {kind} generator built an invalid schedule (a bug): {error}");
    }
    schedule
}
