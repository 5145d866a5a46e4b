//! Parts of a checkpoint written by other replicas (their ZeRO-1 optimizer shards) or by
//! pipeline stages in other processes (their [`StagePart`](crate::StagePart)s).
//!
//! One replica writes the checkpoint; each other replica writes its part into
//! `dir/.parts-step-N/` (a temporary name, synced, renamed, so a part is there whole or not
//! at all). The writing replica waits for every part, bounded by a timeout, moves the parts
//! into its temporary checkpoint directory with the rest and lists them in the manifest: the
//! checkpoint becomes "latest" only once every replica's part is in it. The file system is
//! the agreement, so this works the same for threads and for MPI processes sharing a run
//! directory. A replica whose part cannot be written leaves a `.failed` note with the reason,
//! which ends the wait at once. A pipeline's stage parts are joined, not stored as they are:
//! the writing stage takes them (`take_part`) instead of moving them.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::CheckpointError;
use crate::store::{CheckpointStore, sync_dir};

/// How often the writing replica looks for parts not there yet.
const POLL: Duration = Duration::from_millis(10);

/// The parts a checkpoint waits for, and how long.
#[derive(Debug, Clone)]
pub struct PartsToCollect {
    /// The parts' file names.
    pub names: Vec<String>,
    /// How long to wait for each before giving up.
    pub timeout: Duration,
    /// Raised when the run is abandoned (a replica failed): waiting stops at once.
    pub abandoned: Arc<AtomicBool>,
}

impl CheckpointStore {
    /// Where the parts of the checkpoint at `step` wait.
    fn parts_dir(&self, step: usize) -> PathBuf {
        self.dir().join(format!(".parts-step-{step:09}"))
    }

    /// Writes `bytes` as the part `name` of the checkpoint at `step`, for the replica that
    /// writes the checkpoint to collect; on failure, leaves a note saying why, so the writing
    /// replica stops waiting.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming what could not be written.
    pub fn save_part(&self, step: usize, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let dir = self.parts_dir(step);
        let written = (|| {
            fs::create_dir_all(&dir).map_err(CheckpointError::io(&dir))?;
            let temporary = dir.join(format!(".{name}.partial-{}", std::process::id()));
            self.write_synced(&temporary, bytes)?;
            let target = dir.join(name);
            fs::rename(&temporary, &target).map_err(CheckpointError::io(&target))?;
            sync_dir(&dir)
        })();
        if let Err(err) = &written {
            self.note_part_failure(step, name, &err.to_string());
        }
        written
    }

    /// Leaves a note that the part `name` of the checkpoint at `step` will not come, saying
    /// `why`, so that the replica collecting the parts stops waiting for it at once. Best
    /// effort: if even the note cannot be written, the collector's timeout still ends its
    /// wait.
    pub fn note_part_failure(&self, step: usize, name: &str, why: &str) {
        let dir = self.parts_dir(step);
        let _ = fs::create_dir_all(&dir);
        // Written beside and renamed into place: a collector polling for the note must never
        // read it half written (it did, and reported an empty reason).
        let (draft, note) = (
            dir.join(format!("{name}.failed.draft")),
            dir.join(format!("{name}.failed")),
        );
        if fs::write(&draft, why).is_ok() {
            let _ = fs::rename(&draft, &note);
        }
    }

    /// Waits for the part `name` of the checkpoint at `step` and moves it into `into`;
    /// returns its contents.
    pub(crate) fn collect_part(
        &self,
        step: usize,
        name: &str,
        into: &Path,
        parts: &PartsToCollect,
    ) -> Result<Vec<u8>, CheckpointError> {
        let part = self.wait_for_part(step, name, parts)?;
        let bytes = fs::read(&part).map_err(CheckpointError::io(&part))?;
        let target = into.join(name);
        fs::rename(&part, &target).map_err(CheckpointError::io(&target))?;
        Ok(bytes)
    }

    /// Waits for the part `name` of the checkpoint at `step` and takes its contents (the
    /// file removed): for parts that are joined, not stored as they are.
    pub(crate) fn take_part(
        &self,
        step: usize,
        name: &str,
        parts: &PartsToCollect,
    ) -> Result<Vec<u8>, CheckpointError> {
        let part = self.wait_for_part(step, name, parts)?;
        let bytes = fs::read(&part).map_err(CheckpointError::io(&part))?;
        fs::remove_file(&part).map_err(CheckpointError::io(&part))?;
        Ok(bytes)
    }

    /// Waits until the part `name` of the checkpoint at `step` is there (bounded by the
    /// timeout, ended by a failure note or the run abandoned); its path.
    fn wait_for_part(
        &self,
        step: usize,
        name: &str,
        parts: &PartsToCollect,
    ) -> Result<PathBuf, CheckpointError> {
        let dir = self.parts_dir(step);
        let (part, failed) = (dir.join(name), dir.join(format!("{name}.failed")));
        let start = Instant::now();
        while !part.is_file() {
            if let Ok(reason) = fs::read_to_string(&failed) {
                return Err(CheckpointError::Corrupt {
                    path: part,
                    reason: format!("its replica could not write it: {reason}"),
                });
            }
            if parts.abandoned.load(Ordering::Acquire) {
                return Err(CheckpointError::Corrupt {
                    path: part,
                    reason: "the run was abandoned before every replica wrote its part".into(),
                });
            }
            if start.elapsed() > parts.timeout {
                return Err(CheckpointError::Corrupt {
                    path: part,
                    reason: format!(
                        "its replica did not write it within {:?} (lost?); the previous checkpoints stay",
                        parts.timeout
                    ),
                });
            }
            std::thread::sleep(POLL);
        }
        Ok(part)
    }

    /// Removes the part directories of steps up to `step` (their checkpoint is written).
    pub(crate) fn remove_parts_through(&self, step: usize) {
        self.remove_parts(|s| s <= step);
    }

    /// Removes every part directory: parts an earlier, interrupted run left behind. Call it
    /// before any replica of this run trains.
    pub fn remove_stale_parts(&self) {
        self.remove_parts(|_| true);
    }

    fn remove_parts(&self, remove: impl Fn(usize) -> bool) {
        let Ok(entries) = fs::read_dir(self.dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(step) = name
                .strip_prefix(".parts-step-")
                .and_then(|s| s.parse::<usize>().ok())
                && remove(step)
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}
