//! A pipeline stage's part as a file, for stages in other processes (one stage per MPI
//! process, sharing a run directory).
//!
//! Stage `s > 0` writes its [`StagePart`] into the checkpoint's parts directory
//! ([`Checkpointer::stage_part_writer`], synced and renamed into place, or a `.failed` note
//! saying why not); stage 0 waits for every one, bounded by a timeout, and joins them with
//! its own exactly as a pipeline in one process does ([`Checkpointer::stage_writer_collecting`]):
//! the manifest is written only once every stage's part is in, so the checkpoint is
//! complete or absent, and it is the same checkpoint, byte for byte, as the one the same
//! pipeline writes in one process. The file system is the agreement, as for ZeRO-1's parts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_train::{StepState, TrainPosition};
use serde::{Deserialize, Serialize};

use crate::parts::PartsToCollect;
use crate::stage_parts::write_stages;
use crate::{CheckpointError, Checkpointer, StagePart};

/// What a stage part file starts with (and its format's version).
const MAGIC: &[u8] = b"kiln-stage-part-1\n";

/// The name of stage `stage`'s part of a pipeline of `stages` stages.
pub fn stage_part_name(stage: usize, stages: usize) -> String {
    format!("stage-{stage}-of-{stages}.part")
}

/// The file's header: what is not bytes, and the checks of what is.
#[derive(Serialize, Deserialize)]
struct Header {
    ids: BTreeMap<String, u64>,
    step_state: StepState,
    model_bytes: u64,
    model_crc32: u32,
    optimizer_bytes: u64,
    optimizer_crc32: u32,
}

impl StagePart {
    /// The part as one file's bytes: a header (ids, step state, lengths and CRC-32s), then
    /// the module's and the optimizer's burnpack bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = Header {
            ids: self.ids.clone(),
            step_state: self.step_state.clone(),
            model_bytes: self.model.len() as u64,
            model_crc32: crc32fast::hash(&self.model),
            optimizer_bytes: self.optimizer.len() as u64,
            optimizer_crc32: crc32fast::hash(&self.optimizer),
        };
        let header = serde_json::to_vec(&header).expect("a header serialises");
        let mut bytes = Vec::with_capacity(
            MAGIC.len() + 8 + header.len() + self.model.len() + self.optimizer.len(),
        );
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&self.model);
        bytes.extend_from_slice(&self.optimizer);
        bytes
    }

    /// The part [`to_bytes`](Self::to_bytes) wrote; `path` names errors.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] for bytes that are not a stage part, or a truncated or
    /// changed one.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let rest = bytes
            .strip_prefix(MAGIC)
            .ok_or_else(|| corrupt("not a pipeline stage's part".into()))?;
        let (length, rest) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| corrupt("truncated before its header".into()))?;
        let length = usize::try_from(u64::from_le_bytes(*length))
            .map_err(|_| corrupt("a header longer than memory".into()))?;
        let header = rest
            .get(..length)
            .ok_or_else(|| corrupt("truncated in its header".into()))?;
        let header: Header =
            serde_json::from_slice(header).map_err(|err| corrupt(format!("its header: {err}")))?;
        let body = &rest[length..];
        let (model, optimizer) = (header.model_bytes as usize, header.optimizer_bytes as usize);
        if body.len() != model.saturating_add(optimizer) {
            return Err(corrupt(format!(
                "{} bytes after its header, it says {} (truncated?)",
                body.len(),
                model.saturating_add(optimizer)
            )));
        }
        let (model, optimizer) = body.split_at(model);
        if crc32fast::hash(model) != header.model_crc32
            || crc32fast::hash(optimizer) != header.optimizer_crc32
        {
            return Err(corrupt("checksum mismatch (corrupted)".into()));
        }
        Ok(Self {
            model: model.to_vec(),
            optimizer: optimizer.to_vec(),
            ids: header.ids,
            step_state: header.step_state,
        })
    }
}

impl Checkpointer {
    /// What writes stage `stage`'s (`stage > 0`) part of the checkpoint at `position` of a
    /// pipeline of `stages` stages, to run on a thread of its own, for stage 0's writer to
    /// collect; on failure it leaves a note that ends that writer's wait at once. It returns
    /// where the checkpoint will be.
    ///
    /// # Errors (of the returned writer)
    /// [`CheckpointError::Io`] naming what could not be written.
    pub fn stage_part_writer(
        &self,
        position: &TrainPosition,
        stage: usize,
        stages: usize,
    ) -> impl FnOnce(StagePart) -> Result<PathBuf, CheckpointError> + Send + use<> {
        let (store, step) = (self.store().clone(), position.step);
        move |part| {
            store.save_part(step, &stage_part_name(stage, stages), &part.to_bytes())?;
            Ok(store.path_for(step))
        }
    }

    /// What leaves the note that stage `stage`'s part of the checkpoint at `position` (of a
    /// pipeline of `stages` stages) will not come, saying why: stage 0's writer then stops
    /// waiting for it at once instead of at its timeout.
    pub fn stage_part_failure(
        &self,
        position: &TrainPosition,
        stage: usize,
        stages: usize,
    ) -> impl FnOnce(&str) + Send + use<> {
        let (store, step) = (self.store().clone(), position.step);
        move |why| store.note_part_failure(step, &stage_part_name(stage, stages), why)
    }

    /// What writes a pipeline's checkpoint at `position` from stage 0's part, given to it,
    /// and the parts of stages `1..stages`, which other processes write
    /// ([`stage_part_writer`](Self::stage_part_writer)): waited for (each at most `timeout`,
    /// at once ended by a failure note or `abandoned`), then joined as
    /// [`stage_writer`](Self::stage_writer) joins them.
    pub fn stage_writer_collecting(
        &self,
        position: &TrainPosition,
        stages: usize,
        timeout: Duration,
        abandoned: Arc<AtomicBool>,
    ) -> impl FnOnce(StagePart) -> Result<PathBuf, CheckpointError> + Send + use<> {
        let (store, mut manifest) = (self.store().clone(), self.manifest(position));
        let step = position.step;
        move |first| {
            let wait = PartsToCollect {
                names: Vec::new(),
                timeout,
                abandoned,
            };
            let mut parts = vec![first];
            for stage in 1..stages {
                let name = stage_part_name(stage, stages);
                let bytes = store.take_part(step, &name, &wait)?;
                let path = store.dir().join(&name);
                parts.push(StagePart::from_bytes(&bytes, &path)?);
            }
            write_stages(&store, &mut manifest, parts)
        }
    }

    /// Removes stage parts (and any other parts) an earlier, interrupted run left behind:
    /// call it on the writing stage before any stage of this run trains.
    pub fn remove_stale_parts(&self) {
        self.store().remove_stale_parts();
    }
}
