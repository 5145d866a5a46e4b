//! Checkpoint directories: written atomically, kept K at a time, verified when read.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::CheckpointError;
use crate::manifest::{FileEntry, MANIFEST, Manifest};
use crate::parts::PartsToCollect;

/// Where a run's checkpoints live: `dir/step-000000123/` each, complete ones only (those
/// with a manifest). A save writes into a hidden temporary directory, syncs every file and
/// the manifest (last) to disk, then renames it into place, so a crash at any moment leaves
/// the previous checkpoints as they were and never a partial "latest".
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep: usize,
    /// Bytes left before writes fail as on a full disk (fault injection), shared by clones.
    space_left: Option<Arc<AtomicU64>>,
}

/// The newest checkpoint that verifies ([`CheckpointStore::latest_whole`]).
#[derive(Debug)]
pub struct LatestWhole {
    /// Its directory.
    pub path: PathBuf,
    /// Newer checkpoints that did not verify, newest first, with why.
    pub skipped: Vec<(PathBuf, CheckpointError)>,
}

/// A checkpoint read back and verified.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// Its directory.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its files' contents, by name, each matching its manifest entry.
    pub files: BTreeMap<String, Vec<u8>>,
}

impl LoadedCheckpoint {
    /// The contents of `name`.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] if the checkpoint has no such file.
    pub fn file(&self, name: &str) -> Result<&[u8], CheckpointError> {
        self.files
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| CheckpointError::Corrupt {
                path: self.path.join(name),
                reason: "missing from the checkpoint".into(),
            })
    }
}

impl CheckpointStore {
    /// Checkpoints in `dir`, keeping the newest `keep` (at least one).
    pub fn new(dir: impl Into<PathBuf>, keep: usize) -> Self {
        Self {
            dir: dir.into(),
            keep: keep.max(1),
            space_left: None,
        }
    }

    /// Fault injection, for testing what a full disk does to a run: the store (and its
    /// clones) may write `bytes` more in all; the write that passes them writes what fits,
    /// then fails as a full disk does (`ENOSPC`, "No space left on device").
    pub fn with_space_left(mut self, bytes: u64) -> Self {
        self.space_left = Some(Arc::new(AtomicU64::new(bytes)));
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory a checkpoint at `step` has.
    pub fn path_for(&self, step: usize) -> PathBuf {
        self.dir.join(format!("step-{step:09}"))
    }

    /// Writes `files` and `manifest` (its `files` list is filled here) as the checkpoint of
    /// `manifest.position.step`, then removes all but the newest `keep`.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming what could not be written; the checkpoints already
    /// there stay as they were.
    pub fn save(
        &self,
        manifest: Manifest,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<PathBuf, CheckpointError> {
        self.save_with_parts(manifest, files, None)
    }

    /// [`save`](Self::save), with the parts other replicas write
    /// ([`save_part`](Self::save_part)) waited for and made part of the checkpoint: it
    /// counts (has a manifest) only once every part is in it.
    ///
    /// # Errors
    /// As [`save`](Self::save), and [`CheckpointError::Corrupt`] naming a part that did not
    /// arrive in time or whose replica could not write it.
    pub fn save_with_parts(
        &self,
        mut manifest: Manifest,
        files: Vec<(String, Vec<u8>)>,
        parts: Option<&PartsToCollect>,
    ) -> Result<PathBuf, CheckpointError> {
        fs::create_dir_all(&self.dir).map_err(CheckpointError::io(&self.dir))?;
        self.sweep()?;
        let step = manifest.position.step;
        let partial = self
            .dir
            .join(format!(".step-{step:09}.partial-{}", std::process::id()));
        if partial.exists() {
            fs::remove_dir_all(&partial).map_err(CheckpointError::io(&partial))?;
        }
        let written = self.write_all(&partial, &mut manifest, files, parts);
        if let Err(err) = written {
            let _ = fs::remove_dir_all(&partial);
            return Err(err);
        }
        let target = self.path_for(step);
        // The same step saved again (a run restarted from an earlier checkpoint): the old one
        // is moved aside, not deleted, until the new one is in place.
        let aside = self
            .dir
            .join(format!(".step-{step:09}.replaced-{}", std::process::id()));
        let replacing = target.exists();
        if replacing {
            fs::rename(&target, &aside).map_err(CheckpointError::io(&target))?;
            failpoint("save-replaced");
        }
        fs::rename(&partial, &target).map_err(CheckpointError::io(&target))?;
        sync_dir(&self.dir)?;
        if replacing {
            let _ = fs::remove_dir_all(&aside);
        }
        self.remove_parts_through(step);
        // The checkpoint is written: failing to remove old ones is no reason to stop.
        if let Err(err) = self.prune() {
            eprintln!("warning: checkpoints not pruned: {err}");
        }
        Ok(target)
    }

    /// Complete checkpoints, oldest first, with their steps.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] if the directory cannot be listed (a missing one is empty).
    pub fn list(&self) -> Result<Vec<(usize, PathBuf)>, CheckpointError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(CheckpointError::io(&self.dir)(err)),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(CheckpointError::io(&self.dir))?;
            let name = entry.file_name();
            let Some(step) = name
                .to_str()
                .and_then(|n| n.strip_prefix("step-"))
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            if entry.path().join(MANIFEST).is_file() {
                found.push((step, entry.path()));
            }
        }
        found.sort();
        Ok(found)
    }

    /// The newest complete checkpoint, if any.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn latest(&self) -> Result<Option<PathBuf>, CheckpointError> {
        Ok(self.list()?.pop().map(|(_, path)| path))
    }

    /// The newest checkpoint that loads and verifies (every file against its manifest), and
    /// the newer ones skipped on the way, each with why (a disk that lost or changed a file
    /// after the save). `None` when no checkpoint verifies.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn latest_whole(&self) -> Result<Option<LatestWhole>, CheckpointError> {
        let mut skipped = Vec::new();
        for (_, path) in self.list()?.into_iter().rev() {
            match Self::load(&path) {
                Ok(_) => return Ok(Some(LatestWhole { path, skipped })),
                Err(err) => skipped.push((path, err)),
            }
        }
        Ok(None)
    }

    /// Removes all but the newest `keep` complete checkpoints. Each is first renamed out of
    /// the checkpoints' names (atomically, and made durable), then deleted: a process killed
    /// while deleting leaves a hidden `.step-N.removing-PID` that no listing reports and the
    /// next save sweeps, never a listed checkpoint with files missing.
    fn prune(&self) -> Result<(), CheckpointError> {
        let complete = self.list()?;
        let excess = complete.len().saturating_sub(self.keep);
        for (step, path) in &complete[..excess] {
            let doomed = self
                .dir
                .join(format!(".step-{step:09}.removing-{}", std::process::id()));
            fs::rename(path, &doomed).map_err(CheckpointError::io(path))?;
            sync_dir(&self.dir)?;
            failpoint("prune-renamed");
            remove_tree(&doomed)?;
        }
        Ok(())
    }

    /// Clears what interrupted saves and removals left behind (run by the writer before each
    /// save): temporary directories of other processes' saves and of removals are deleted; a
    /// checkpoint moved aside to be replaced (`.step-N.replaced-PID`) is put back when its
    /// replacement never arrived, else deleted.
    fn sweep(&self) -> Result<(), CheckpointError> {
        let mine = format!("-{}", std::process::id());
        for entry in fs::read_dir(&self.dir).map_err(CheckpointError::io(&self.dir))? {
            let entry = entry.map_err(CheckpointError::io(&self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(".step-") else {
                continue;
            };
            let Some((step, kind)) = rest.split_once('.') else {
                continue;
            };
            let path = entry.path();
            if kind.starts_with("replaced-") {
                let target = self.dir.join(format!("step-{step}"));
                if !target.exists() {
                    fs::rename(&path, &target).map_err(CheckpointError::io(&path))?;
                    sync_dir(&self.dir)?;
                    continue;
                }
                remove_tree(&path)?;
            } else if kind.starts_with("removing-")
                || (kind.starts_with("partial-") && !kind.ends_with(&mine))
            {
                remove_tree(&path)?;
            }
        }
        Ok(())
    }

    /// Reads the checkpoint in `path` and verifies every file against its manifest.
    ///
    /// # Errors
    /// [`CheckpointError::Missing`] if `path` holds no complete checkpoint;
    /// [`CheckpointError::Corrupt`] naming a file that is missing, truncated or changed.
    pub fn load(path: &Path) -> Result<LoadedCheckpoint, CheckpointError> {
        let manifest = Manifest::read(path)?;
        let mut files = BTreeMap::new();
        for entry in &manifest.files {
            let file = path.join(&entry.name);
            let bytes = fs::read(&file).map_err(|err| CheckpointError::Corrupt {
                path: file.clone(),
                reason: format!("listed in the manifest but unreadable: {err}"),
            })?;
            if bytes.len() as u64 != entry.bytes {
                return Err(CheckpointError::Corrupt {
                    path: file,
                    reason: format!(
                        "{} bytes, the manifest says {} (truncated or replaced)",
                        bytes.len(),
                        entry.bytes
                    ),
                });
            }
            let crc = crc32fast::hash(&bytes);
            if crc != entry.crc32 {
                return Err(CheckpointError::Corrupt {
                    path: file,
                    reason: format!(
                        "checksum {crc:08x}, the manifest says {:08x} (corrupted)",
                        entry.crc32
                    ),
                });
            }
            files.insert(entry.name.clone(), bytes);
        }
        Ok(LoadedCheckpoint {
            path: path.to_path_buf(),
            manifest,
            files,
        })
    }
}

impl CheckpointStore {
    /// Writes every file, collects every part, then writes the manifest, each synced, then
    /// syncs the directory.
    fn write_all(
        &self,
        dir: &Path,
        manifest: &mut Manifest,
        files: Vec<(String, Vec<u8>)>,
        parts: Option<&PartsToCollect>,
    ) -> Result<(), CheckpointError> {
        fs::create_dir_all(dir).map_err(CheckpointError::io(dir))?;
        manifest.files.clear();
        for (name, bytes) in files {
            self.write_synced(&dir.join(&name), &bytes)?;
            manifest.files.push(entry(name, &bytes));
        }
        for name in parts.map_or(&[][..], |p| &p.names[..]) {
            let parts = parts.expect("names come from it");
            let bytes = self.collect_part(manifest.position.step, name, dir, parts)?;
            manifest.files.push(entry(name.clone(), &bytes));
        }
        failpoint("save-written");
        let text = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
        self.write_synced(&dir.join(MANIFEST), &text)?;
        sync_dir(dir)
    }
}

fn entry(name: String, bytes: &[u8]) -> FileEntry {
    FileEntry {
        name,
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    }
}

impl CheckpointStore {
    /// Writes `bytes` into a new file at `path` and syncs it to disk.
    pub(crate) fn write_synced(&self, path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
        let mut file = File::create(path).map_err(CheckpointError::io(path))?;
        let fits = self.take_space(bytes.len());
        file.write_all(&bytes[..fits])
            .map_err(CheckpointError::io(path))?;
        if fits < bytes.len() {
            // ENOSPC, as the system reports a full disk.
            return Err(CheckpointError::io(path)(
                std::io::Error::from_raw_os_error(28),
            ));
        }
        file.sync_all().map_err(CheckpointError::io(path))
    }

    /// How many of `wanted` bytes the injected space limit lets through (all without one).
    fn take_space(&self, wanted: usize) -> usize {
        let Some(left) = &self.space_left else {
            return wanted;
        };
        let wanted = wanted as u64;
        let mut granted = 0;
        let _ = left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            granted = now.min(wanted);
            Some(now - granted)
        });
        granted as usize
    }
}

/// Makes a directory's entries (new files, renames) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CheckpointError::io(dir))
}

/// Deletes a directory that is already out of the checkpoints' names, file by file (so the
/// failpoint `prune-deleting` can stop a process part-way, as a kill would).
fn remove_tree(dir: &Path) -> Result<(), CheckpointError> {
    for (index, entry) in fs::read_dir(dir)
        .map_err(CheckpointError::io(dir))?
        .enumerate()
    {
        let path = entry.map_err(CheckpointError::io(dir))?.path();
        if path.is_dir() {
            fs::remove_dir_all(&path).map_err(CheckpointError::io(&path))?;
        } else {
            fs::remove_file(&path).map_err(CheckpointError::io(&path))?;
        }
        if index == 0 {
            failpoint("prune-deleting");
        }
    }
    fs::remove_dir(dir).map_err(CheckpointError::io(dir))
}

/// Deterministic kills for tests: the process aborts where `KILN_CHECKPOINT_FAILPOINT`
/// names this point (`save-written`: files written, manifest not; `save-replaced`: the old
/// checkpoint of the same step moved aside; `prune-renamed`; `prune-deleting`: one file of a
/// pruned checkpoint deleted). Read once; nothing happens without the variable.
pub(crate) fn failpoint(name: &str) {
    static POINT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let point = POINT.get_or_init(|| std::env::var("KILN_CHECKPOINT_FAILPOINT").ok());
    if point.as_deref() == Some(name) {
        std::process::abort();
    }
}
