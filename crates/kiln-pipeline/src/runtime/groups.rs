//! The communicators of a run's stage threads: each stage's copies (the D data-parallel
//! replicas of one stage, which add their gradients) and each pipeline's stages (which agree
//! on the gradient's norm and the loss scaler's overflow, and, across processes, exchange
//! activations and gradients).
//!
//! In one process these are in-process groups, one per set of threads. Across processes
//! (one stage per process) they are split from the MPI world, with the same layout as the
//! threads of one process: world rank `r` runs stage `r % P` of pipeline `r / P`, on
//! `--devices` entry `r` (thread `group × P + stage`), so a run across processes trains
//! exactly like the same run in one process.

use std::time::Duration;

use kiln_comm::{Communicator, InProcessGroup};

use crate::runtime::PipelineError;

/// The communicators of this process's stage threads.
pub(crate) struct StageGroups {
    /// Per stage thread, in (group, stage) order: the copies of its stage (with D > 1).
    pub replicas: Vec<Option<Communicator>>,
    /// Per stage thread: its pipeline's stages, when they must agree (in one process).
    pub pipelines: Vec<Option<Communicator>>,
    /// Across processes: this process's pipeline (its stages' links, their agreement and
    /// the gathering of their trained parameters).
    pub across: Option<Communicator>,
}

/// The groups of `groups` pipelines of `stages` stages: in-process groups, or across
/// processes split from `world` (a collective over it: every process calls this once, at
/// the same point). `agreeing`: the stages of a pipeline have a group (to agree on the
/// gradient's norm, or to sum the gradients of a tied parameter they share).
///
/// # Errors
/// [`PipelineError::Config`] if `world` cannot split (not an MPI world),
/// [`PipelineError::PeerLost`] if the split fails.
pub(crate) fn stage_groups(
    world: Option<&Communicator>,
    (groups, stages): (usize, usize),
    timeout: Duration,
    agreeing: bool,
) -> Result<StageGroups, PipelineError> {
    let Some(world) = world else {
        return Ok(StageGroups {
            replicas: communicators(groups, stages, timeout, Members::CopiesOfAStage, groups > 1),
            pipelines: communicators(
                groups,
                stages,
                timeout,
                Members::StagesOfAPipeline,
                agreeing,
            ),
            across: None,
        });
    };
    let rank = world.rank();
    let (group, stage) = (rank / stages, rank % stages);
    let split = |color, key| {
        world.split(color, key).map_err(|err| match err {
            // A world that cannot split (in-process or hybrid) is the caller's choice.
            kiln_comm::CommError::Unsupported { .. } => PipelineError::Config(format!(
                "across processes a pipeline needs an MPI world communicator: {err}"
            )),
            err => PipelineError::PeerLost {
                stage,
                what: format!("the other processes, to form the pipeline's groups ({err})"),
            },
        })
    };
    let mut replicas = unset(groups * stages);
    if groups > 1 {
        replicas[rank] = Some(split(stage, group)?);
    }
    let across = split(group, stage)?;
    Ok(StageGroups {
        replicas,
        pipelines: unset(groups * stages),
        across: Some(across),
    })
}

/// `threads` empty slots (a `Communicator` is not `Clone`, so no `vec![None; n]`).
fn unset(threads: usize) -> Vec<Option<Communicator>> {
    (0..threads).map(|_| None).collect()
}

/// Who shares an in-process group in [`communicators`].
#[derive(Clone, Copy, PartialEq)]
enum Members {
    /// The D copies of one stage.
    CopiesOfAStage,
    /// The P stages of one pipeline.
    StagesOfAPipeline,
}

/// One communicator per stage thread, in (group, stage) order, for in-process groups of
/// `members`; `None` for every thread unless `wanted`.
fn communicators(
    groups: usize,
    stages: usize,
    timeout: Duration,
    members: Members,
    wanted: bool,
) -> Vec<Option<Communicator>> {
    let mut slots = unset(groups * stages);
    if !wanted {
        return slots;
    }
    let by_stage = members == Members::CopiesOfAStage;
    let (sets, size) = if by_stage {
        (stages, groups)
    } else {
        (groups, stages)
    };
    for set in 0..sets {
        let comms = InProcessGroup::new(size).timeout(timeout).build();
        for (rank, comm) in comms.into_iter().enumerate() {
            let (group, stage) = if by_stage { (rank, set) } else { (set, rank) };
            slots[group * stages + stage] = Some(comm);
        }
    }
    slots
}
