//! A checkpoint's manifest: what it holds, for which run, and each file's checksum.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_train::TrainPosition;
use serde::{Deserialize, Serialize};

use crate::CheckpointError;

/// The manifest's format version; a reader refuses others.
pub const FORMAT: u32 = 1;

/// What identifies the run a checkpoint belongs to: resuming needs the same model and the
/// same values for every option that changes the arithmetic (learning rate, batch, seed,
/// precision, ...). Options that only place the work (devices, threads, replicas) are not
/// part of it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunIdentity {
    /// The model and its configuration, as the caller describes it.
    pub model: String,
    /// Each arithmetic option's value, by name (`lr`, `global batch`, `seed`, ...).
    pub arithmetic: BTreeMap<String, String>,
}

impl RunIdentity {
    /// An identity for `model` with no options yet.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            arithmetic: BTreeMap::new(),
        }
    }

    /// Adds an option that must match on resume.
    pub fn with(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.arithmetic.insert(name.into(), value.to_string());
        self
    }

    /// Every difference from `saved` (the checkpoint's), named; empty if they match.
    pub fn differences(&self, saved: &RunIdentity) -> Vec<String> {
        let mut out = Vec::new();
        if self.model != saved.model {
            out.push(format!(
                "model: checkpoint `{}`, this run `{}`",
                saved.model, self.model
            ));
        }
        let names: std::collections::BTreeSet<&String> = self
            .arithmetic
            .keys()
            .chain(saved.arithmetic.keys())
            .collect();
        for name in names {
            let (was, is) = (saved.arithmetic.get(name), self.arithmetic.get(name));
            if was != is {
                let show = |v: Option<&String>| v.map_or("(not set)".to_string(), |v| v.clone());
                out.push(format!(
                    "{name}: checkpoint {}, this run {}",
                    show(was),
                    show(is)
                ));
            }
        }
        out
    }
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Its name inside the checkpoint directory.
    pub name: String,
    /// Its length.
    pub bytes: u64,
    /// CRC-32 of its contents.
    pub crc32: u32,
}

/// The position a checkpoint was taken at (a serde mirror of [`TrainPosition`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Optimizer steps done.
    pub step: usize,
    /// The epoch the next step belongs to.
    pub epoch: usize,
    /// Steps of that epoch done.
    pub step_in_epoch: usize,
}

impl From<TrainPosition> for Position {
    fn from(p: TrainPosition) -> Self {
        Self {
            step: p.step,
            epoch: p.epoch,
            step_in_epoch: p.step_in_epoch,
        }
    }
}

impl From<Position> for TrainPosition {
    fn from(p: Position) -> Self {
        Self {
            step: p.step,
            epoch: p.epoch,
            step_in_epoch: p.step_in_epoch,
        }
    }
}

/// The manifest (`manifest.json`), written last: a checkpoint directory without one is
/// incomplete and never resumed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The kiln version that wrote it.
    pub kiln: String,
    /// The run it belongs to.
    pub run: RunIdentity,
    /// How the run was laid out (devices, replicas, plan): informational, may differ on
    /// resume.
    pub layout: BTreeMap<String, String>,
    /// Where the run stood.
    pub position: Position,
    /// Every other file, with its size and checksum.
    pub files: Vec<FileEntry>,
    /// The files holding the optimizer's state: one, or one part per replica of a run
    /// whose optimizer state was sharded (ZeRO-1), joined on resume. Empty in checkpoints
    /// of earlier builds: `optimizer.bpk` then.
    #[serde(default)]
    pub optimizer: Vec<String>,
}

impl Manifest {
    /// Reads and checks `dir/manifest.json`.
    ///
    /// # Errors
    /// [`CheckpointError::Missing`] without a manifest, [`CheckpointError::Corrupt`] for an
    /// unreadable one or another format.
    pub fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join(MANIFEST);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(CheckpointError::Missing {
                    path: dir.to_path_buf(),
                });
            }
            Err(err) => return Err(CheckpointError::io(&path)(err)),
        };
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|err| CheckpointError::Corrupt {
                path: path.clone(),
                reason: format!("not a kiln checkpoint manifest: {err}"),
            })?;
        if manifest.format != FORMAT {
            return Err(CheckpointError::Corrupt {
                path,
                reason: format!(
                    "format {} (written by kiln {}); this kiln reads format {FORMAT}",
                    manifest.format, manifest.kiln
                ),
            });
        }
        Ok(manifest)
    }
}

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";
