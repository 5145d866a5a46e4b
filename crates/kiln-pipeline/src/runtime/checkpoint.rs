//! Checkpoints of a pipeline run. At a checkpoint step each stage of the first pipeline
//! hands over its part: it takes hold of its module and its optimizer's record (no copy of
//! the tensors) and encodes them on a thread of its own, so the stage goes on with the next
//! step. A writer thread of the driver's collects every stage's part, bounded by the
//! timeout, and joins them into one checkpoint of the data-parallel format
//! ([`Checkpointer::stage_writer`]): it resumes under any plan.
//!
//! Across processes (one stage per MPI process) the stage's part becomes a file in the run
//! directory ([`Checkpointer::stage_part_writer`]) and stage 0's writer waits for every
//! one before it joins them and writes the manifest
//! ([`Checkpointer::stage_writer_collecting`]): the same checkpoint as in one process.
//! Every process waits for its write at the same step and the processes agree on the
//! outcome ([`agree`]), so a failure in one is an error in all of them.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use burn::module::{Module, ParamId};
use burn::optim::ModuleOptimizer;
use crossbeam_channel::{Receiver, Sender};
use kiln_checkpoint::{
    CheckpointError, Checkpointer, StagePart, model_bytes, optimizer_part_bytes,
};
use kiln_comm::Communicator;
use kiln_train::{StepState, TrainPosition};

use crate::runtime::PipelineError;
use crate::runtime::empty::keep_only;

/// A stage's part on its way to the writer: `(stage, the checkpoint's step, the part or why
/// it failed)`. The step matters: a stage may hand over its part of the next checkpoint
/// before a slower stage's part of this one arrives (the encoders are threads of their own).
pub(crate) type PartMessage = (usize, usize, Result<StagePart, String>);

/// Where stages send their parts.
pub(crate) type PartSender = Sender<PartMessage>;

/// Stage `stage` hands over its `model`, `optimizer` state and step state (the loss
/// scaler; `owned`: its parameters' ids by path) for the checkpoint at `step`, encoded on a
/// thread of its own.
pub(crate) fn hand_over<M: Module + 'static>(
    stage: usize,
    step: usize,
    (model, optimizer, step_state): (&M, &ModuleOptimizer, StepState),
    owned: &BTreeMap<String, u64>,
    to: &PartSender,
) {
    // `valid()` here, on the stage's thread: batch-norm statistics are read as they are now,
    // not as a later step leaves them. Only what the stage owns: its copies of tied
    // parameters are saved by their owner's stage.
    let keep: HashSet<ParamId> = owned.values().map(|id| ParamId::from(*id)).collect();
    let model = keep_only(model.valid(), &keep);
    let (record, ids) = (optimizer.to_record(), owned.clone());
    let sender = to.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("kiln-stage-{stage}-checkpoint"))
        .spawn(move || {
            let part = optimizer_part_bytes(record, &ids)
                .map(|optimizer| StagePart {
                    model: model_bytes(&model),
                    optimizer,
                    ids,
                    step_state,
                })
                .map_err(|err| err.to_string());
            let _ = sender.send((stage, step, part));
        });
    if let Err(err) = spawned {
        let _ = to.send((stage, step, Err(format!("starting its encoder: {err}"))));
    }
}

/// The driver's checkpoint writes, one at a time.
pub(crate) struct Writes<'w> {
    parts: Receiver<PartMessage>,
    /// Parts of a later checkpoint that arrived while an earlier one was collected.
    early: Arc<Mutex<Vec<PartMessage>>>,
    stages: usize,
    timeout: Duration,
    /// With stages in other processes: the world (one stage per process; ranks `0..stages`
    /// the first pipeline, whose stages write), over which every write's outcome is agreed,
    /// and the flag that ends stage 0's wait for the others.
    across: Option<(&'w Communicator, Arc<AtomicBool>)>,
    writing: Option<JoinHandle<Result<PathBuf, PipelineError>>>,
}

/// What writes one checkpoint from the parts of this process's stages (in stage order).
type Write = Box<dyn FnOnce(Vec<StagePart>) -> Result<PathBuf, CheckpointError> + Send>;

/// What tells stage 0 that this process's part will not come (why).
type NoteMissing = Box<dyn FnOnce(&str) + Send>;

impl<'w> Writes<'w> {
    /// Writes collecting `stages` parts from `parts`, waiting at most `timeout` for each.
    pub(crate) fn new(parts: Receiver<PartMessage>, stages: usize, timeout: Duration) -> Self {
        Self {
            parts,
            early: Arc::default(),
            stages,
            timeout,
            across: None,
            writing: None,
        }
    }

    /// Across processes, one stage per process of `world`: this process's stage writes its
    /// part as a file and stage 0 joins every part into the checkpoint (waiting for the
    /// others until the timeout, or until `abandoned` is raised); every write's outcome is
    /// agreed over `world` when it is waited for.
    pub(crate) fn across(mut self, world: &'w Communicator, abandoned: Arc<AtomicBool>) -> Self {
        self.across = Some((world, abandoned));
        self
    }

    /// Starts writing the checkpoint at `position` once the previous one is written (and,
    /// across processes, agreed).
    ///
    /// # Errors
    /// The previous write's error (across processes: any process's).
    pub(crate) fn start(
        &mut self,
        checkpointer: &Checkpointer,
        position: &TrainPosition,
    ) -> Result<(), PipelineError> {
        self.wait()?;
        // The stages whose parts this process holds, and what writes them.
        let mut missing: Option<NoteMissing> = None;
        let (local, write): (Vec<usize>, Write) = match &self.across {
            None => (
                (0..self.stages).collect(),
                Box::new(checkpointer.stage_writer(position)),
            ),
            Some((world, abandoned)) if world.rank() == 0 => {
                let write = checkpointer.stage_writer_collecting(
                    position,
                    self.stages,
                    self.timeout,
                    Arc::clone(abandoned),
                );
                (vec![0], Box::new(move |mut parts| write(parts.remove(0))))
            }
            // A copy of a later data-parallel pipeline: the first pipeline's stages write the
            // checkpoint (every copy holds the same parameters); this process only agrees.
            Some((world, _)) if world.rank() >= self.stages => {
                let path = checkpointer.store().path_for(position.step);
                (Vec::new(), Box::new(move |_| Ok(path)))
            }
            Some((world, _)) => {
                let rank = world.rank();
                // A part that never reaches the writer leaves the note a failed write
                // leaves, so stage 0 stops waiting at once.
                missing = Some(Box::new(checkpointer.stage_part_failure(
                    position,
                    rank,
                    self.stages,
                )));
                let write = checkpointer.stage_part_writer(position, rank, self.stages);
                (
                    vec![rank],
                    Box::new(move |mut parts| write(parts.remove(0))),
                )
            }
        };
        let (parts, timeout) = (self.parts.clone(), self.timeout);
        let early = Arc::clone(&self.early);
        let step = position.step;
        let handle = std::thread::Builder::new()
            .name("kiln-pipeline-checkpoint-writer".into())
            .spawn(move || {
                let parts = match collect(&local, step, (&parts, &early), timeout) {
                    Ok(parts) => parts,
                    Err(err) => {
                        if let Some(note) = missing {
                            note(&err.to_string());
                        }
                        return Err(err);
                    }
                };
                write(parts).map_err(PipelineError::checkpoint)
            })
            .map_err(|err| PipelineError::checkpoint(format!("starting the writer: {err}")))?;
        self.writing = Some(handle);
        Ok(())
    }

    /// Waits for the write under way, if any; the checkpoint it wrote. Across processes
    /// every process waits here at the same step and they agree: a write that failed in one
    /// process is an error in all of them.
    ///
    /// # Errors
    /// That write's error (across processes: any process's).
    pub(crate) fn wait(&mut self) -> Result<Option<PathBuf>, PipelineError> {
        let Some(handle) = self.writing.take() else {
            return Ok(None);
        };
        let written = handle
            .join()
            .unwrap_or_else(|_| Err(PipelineError::checkpoint("the checkpoint writer panicked")));
        match &self.across {
            None => written.map(Some),
            Some((world, _)) => agree(world, written).map(Some),
        }
    }
}

/// The parts of the checkpoint at `step` of the `local` stages (in that order): those that
/// arrived early first, then from `parts` (each within `timeout`); parts of a later
/// checkpoint are kept in `early` for its write.
pub(crate) fn collect(
    local: &[usize],
    step: usize,
    (parts, early): (&Receiver<PartMessage>, &Mutex<Vec<PartMessage>>),
    timeout: Duration,
) -> Result<Vec<StagePart>, PipelineError> {
    let mut got: Vec<Option<StagePart>> = local.iter().map(|_| None).collect();
    let mut early = early.lock().unwrap_or_else(|p| p.into_inner());
    let mut waiting = std::mem::take(&mut *early).into_iter();
    while got.iter().any(Option::is_none) {
        let (stage, at, part) = match waiting.next() {
            Some(message) => message,
            None => parts.recv_timeout(timeout).map_err(|_| {
                PipelineError::checkpoint(format!(
                    "step {step}: a stage's part did not arrive within {timeout:?}"
                ))
            })?,
        };
        if at != step {
            early.push((stage, at, part));
            continue;
        }
        let part = part.map_err(|err| {
            PipelineError::checkpoint(format!("step {step}: stage {stage}: {err}"))
        })?;
        let slot = local.iter().position(|&s| s == stage).ok_or_else(|| {
            PipelineError::checkpoint(format!(
                "step {step}: a part of stage {stage}, which runs elsewhere"
            ))
        })?;
        got[slot] = Some(part);
    }
    early.extend(waiting);
    Ok(got.into_iter().flatten().collect())
}

/// `outcome` agreed over `world`: an error if any process's is one (its own error on the
/// process that failed, one naming the first failed process on the others).
///
/// # Errors
/// The failure, or [`PipelineError::PeerLost`] if the processes cannot agree (bounded by
/// the communicator's timeout).
pub(crate) fn agree<T>(
    world: &Communicator,
    outcome: Result<T, PipelineError>,
) -> Result<T, PipelineError> {
    let (rank, size) = (world.rank(), world.world_size());
    // The lowest failed rank, as `size - rank` under a maximum (0: none failed).
    let mut failed = [if outcome.is_err() {
        (size - rank) as f32
    } else {
        0.0
    }];
    world
        .all_reduce(&mut failed, kiln_comm::ReduceOp::Max)
        .map_err(|err| PipelineError::PeerLost {
            stage: rank,
            what: format!("the other processes' checkpoint outcome ({err})"),
        })?;
    match outcome {
        Err(err) => Err(err),
        Ok(_) if failed[0] > 0.0 => Err(PipelineError::checkpoint(format!(
            "the checkpoint failed in process {} (its stage's error is reported there)",
            size - failed[0] as usize
        ))),
        Ok(value) => Ok(value),
    }
}

/// Where a run across the processes of `world` starts (`start`: this process's reading of
/// the checkpoint, or a fresh run's start), agreed: every process starts at the same step,
/// or every one fails. Stage 0 first removes the parts an interrupted run left behind:
/// no stage of this run writes one before this agreement.
///
/// # Errors
/// Any process's error reading the checkpoint, processes that would start at different
/// steps (another checkpoint, or none), or [`PipelineError::PeerLost`].
pub(crate) fn agree_start(
    world: &Communicator,
    checkpointer: Option<&Checkpointer>,
    start: Result<TrainPosition, PipelineError>,
) -> Result<TrainPosition, PipelineError> {
    if world.rank() == 0
        && let Some(checkpointer) = checkpointer
    {
        checkpointer.remove_stale_parts();
    }
    let start = agree(world, start)?;
    // The first and the last step any process starts at, exactly.
    let (first, last) =
        world
            .value_range(start.step as u64)
            .map_err(|err| PipelineError::PeerLost {
                stage: world.rank(),
                what: format!("the other processes' start ({err})"),
            })?;
    if first != last {
        return Err(PipelineError::checkpoint(format!(
            "the processes would start at different steps ({first} to {last}): every process must resume the same checkpoint"
        )));
    }
    Ok(start)
}
