//! Checkpoints of a pipeline run. At a checkpoint step each stage of the first pipeline
//! hands over its part: it takes hold of its module and its optimizer's record (no copy of
//! the tensors) and encodes them on a thread of its own, so the stage goes on with the next
//! step. A writer thread of the driver's collects every stage's part, bounded by the
//! timeout, and joins them into one checkpoint of the data-parallel format
//! ([`Checkpointer::stage_writer`]): it resumes under any plan.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use crossbeam_channel::{Receiver, Sender};
use kiln_checkpoint::{
    CheckpointError, Checkpointer, StagePart, model_bytes, optimizer_part_bytes,
};
use kiln_train::{StepState, TrainPosition};

use crate::runtime::PipelineError;

/// Where stages send their parts: `(stage, part or why it failed)`.
pub(crate) type PartSender = Sender<(usize, Result<StagePart, String>)>;

/// Stage `stage` hands over its `model`, `optimizer` state and step state (the loss
/// scaler; `owned`: its parameters' ids by path), encoded on a thread of its own.
pub(crate) fn hand_over<M: Module + 'static>(
    stage: usize,
    (model, optimizer, step_state): (&M, &ModuleOptimizer, StepState),
    owned: &BTreeMap<String, u64>,
    to: &PartSender,
) {
    // `valid()` here, on the stage's thread: batch-norm statistics are read as they are now,
    // not as a later step leaves them.
    let (model, record, ids) = (model.valid(), optimizer.to_record(), owned.clone());
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
            let _ = sender.send((stage, part));
        });
    if let Err(err) = spawned {
        let _ = to.send((stage, Err(format!("starting its encoder: {err}"))));
    }
}

/// The driver's checkpoint writes, one at a time.
pub(crate) struct Writes {
    parts: Receiver<(usize, Result<StagePart, String>)>,
    stages: usize,
    timeout: Duration,
    writing: Option<JoinHandle<Result<PathBuf, PipelineError>>>,
}

impl Writes {
    /// Writes collecting `stages` parts from `parts`, waiting at most `timeout` for each.
    pub(crate) fn new(
        parts: Receiver<(usize, Result<StagePart, String>)>,
        stages: usize,
        timeout: Duration,
    ) -> Self {
        Self {
            parts,
            stages,
            timeout,
            writing: None,
        }
    }

    /// Starts writing the checkpoint at `position` once the previous one is written.
    ///
    /// # Errors
    /// The previous write's error.
    pub(crate) fn start(
        &mut self,
        checkpointer: &Checkpointer,
        position: &TrainPosition,
    ) -> Result<(), PipelineError> {
        self.wait()?;
        let write = checkpointer.stage_writer(position);
        let (parts, stages, timeout) = (self.parts.clone(), self.stages, self.timeout);
        let step = position.step;
        let handle = std::thread::Builder::new()
            .name("kiln-pipeline-checkpoint-writer".into())
            .spawn(move || {
                let mut got: Vec<Option<StagePart>> = (0..stages).map(|_| None).collect();
                for _ in 0..stages {
                    let (stage, part) = parts.recv_timeout(timeout).map_err(|_| {
                        PipelineError::Checkpoint(format!(
                            "step {step}: a stage's part did not arrive within {timeout:?}"
                        ))
                    })?;
                    let part = part.map_err(|err| {
                        PipelineError::Checkpoint(format!("step {step}: stage {stage}: {err}"))
                    })?;
                    got[stage] = Some(part);
                }
                let parts = got.into_iter().map(|p| p.expect("one per stage")).collect();
                write(parts)
                    .map_err(|err: CheckpointError| PipelineError::Checkpoint(err.to_string()))
            })
            .map_err(|err| PipelineError::Checkpoint(format!("starting the writer: {err}")))?;
        self.writing = Some(handle);
        Ok(())
    }

    /// Waits for the write under way, if any; the checkpoint it wrote.
    ///
    /// # Errors
    /// That write's error.
    pub(crate) fn wait(&mut self) -> Result<Option<PathBuf>, PipelineError> {
        match self.writing.take() {
            None => Ok(None),
            Some(handle) => handle
                .join()
                .unwrap_or_else(|_| {
                    Err(PipelineError::Checkpoint(
                        "the checkpoint writer panicked".into(),
                    ))
                })
                .map(Some),
        }
    }
}
