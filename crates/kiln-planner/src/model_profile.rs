//! A model's profiles at several batch sizes, what they predict for any other size, and
//! their cache on disk.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::profile::BatchProfile;

/// What a profile was measured under: a cached profile is reused only for the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProfileKey {
    /// The model and its configuration, as the caller names it (e.g. `resnet18 width 16`).
    pub model: String,
    /// The device, as `--devices` names it (`cpu`, `cuda:0`).
    pub device: String,
    /// The host: its CPU ([`kiln_core::cpu_name`]) and vector instructions, a `KILN_MAX_ISA`
    /// cap, a debug build. A cache in a home directory shared between machines keeps each
    /// kind of host's profiles apart (not GPUs of different models behind the same CPU:
    /// give such machines a `--profile-cache DIR` each).
    #[serde(default)]
    pub machine: String,
    /// `f32`, `bf16` or `f16`.
    pub precision: String,
    /// The optimizer (its state size enters the memory estimate).
    pub optimizer: String,
    /// Compute threads the profile ran with.
    pub threads: usize,
    /// Batch sizes profiled, in increasing order.
    pub batches: Vec<usize>,
    /// The kiln version that measured it (kernels change between versions).
    pub kiln: String,
    /// Whether the training device recomputed activations (Burn's gradient checkpointing).
    #[serde(default)]
    pub gradient_checkpointing: bool,
}

/// A model's per-segment profiles on one device at several batch sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// What it was measured under.
    pub key: ProfileKey,
    /// One profile per batch size, in increasing batch order, all of the same segments.
    pub batches: Vec<BatchProfile>,
    /// Seconds per trainable parameter byte of one optimizer update
    /// ([`profile_update`](crate::profile_update)); 0 when not measured.
    #[serde(default)]
    pub update_seconds_per_byte: f64,
}

/// One segment's predicted cost at a given batch size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegmentAt {
    /// Forward seconds.
    pub forward: f64,
    /// Backward seconds.
    pub backward: f64,
    /// Trainable parameter bytes.
    pub trainable_bytes: u64,
    /// Other float state bytes.
    pub buffer_bytes: u64,
    /// Output bytes.
    pub output_bytes: u64,
    /// Bytes kept for backward, if measured.
    pub activation_bytes: Option<u64>,
}

impl ModelProfile {
    /// Segments of the model.
    pub fn segments(&self) -> usize {
        self.batches.first().map_or(0, |b| b.segments.len())
    }

    /// Segment names, in order.
    pub fn segment_names(&self) -> Vec<String> {
        self.batches.first().map_or_else(Vec::new, |b| {
            b.segments.iter().map(|s| s.name.clone()).collect()
        })
    }

    /// Every segment's predicted cost at `batch` samples: times and kept activations are
    /// linear in the batch between (and beyond) the two nearest profiled sizes (a fixed cost
    /// per call plus a cost per sample, fitted through them), never below zero; with one
    /// profiled size, they scale in proportion to the batch. Output bytes scale in
    /// proportion; parameter bytes do not depend on the batch.
    ///
    /// # Panics
    /// If the profile holds no batch size.
    pub fn at(&self, batch: usize) -> Vec<SegmentAt> {
        assert!(
            !self.batches.is_empty(),
            "a model profile holds a batch size"
        );
        let (low, high) = self.bracket(batch);
        let x = batch as f64;
        let line = |v_low: f64, v_high: f64| -> f64 {
            let (b_low, b_high) = (low.batch as f64, high.batch as f64);
            if low.batch == high.batch {
                v_low * x / b_low
            } else {
                (v_low + (v_high - v_low) * (x - b_low) / (b_high - b_low)).max(0.0)
            }
        };
        low.segments
            .iter()
            .zip(&high.segments)
            .map(|(l, h)| SegmentAt {
                forward: line(l.forward_seconds, h.forward_seconds),
                backward: line(l.backward_seconds, h.backward_seconds),
                trainable_bytes: l.trainable_bytes,
                buffer_bytes: l.buffer_bytes,
                output_bytes: (l.output_bytes as f64 * x / low.batch as f64).round() as u64,
                activation_bytes: l
                    .activation_bytes
                    .zip(h.activation_bytes)
                    .map(|(a, b)| line(a as f64, b as f64).round() as u64),
            })
            .collect()
    }

    /// The two profiled sizes nearest `batch` (the same one twice with a single size).
    fn bracket(&self, batch: usize) -> (&BatchProfile, &BatchProfile) {
        let n = self.batches.len();
        if n == 1 {
            return (&self.batches[0], &self.batches[0]);
        }
        let upper = self
            .batches
            .iter()
            .position(|b| b.batch >= batch)
            .unwrap_or(n - 1)
            .max(1);
        (&self.batches[upper - 1], &self.batches[upper])
    }
}

/// Profiles kept as JSON files in a directory, one per [`ProfileKey`].
#[derive(Debug, Clone)]
pub struct ProfileCache {
    dir: PathBuf,
}

impl ProfileCache {
    /// A cache in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The file that holds the profile of `key`.
    pub fn path(&self, key: &ProfileKey) -> PathBuf {
        let text = serde_json::to_string(key).expect("a key serialises");
        // FNV-1a: a stable name from the key (std's hasher may change between releases).
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        self.dir.join(format!("profile-{hash:016x}.json"))
    }

    /// The cached profile of `key`, if there is one for exactly that key.
    ///
    /// # Errors
    /// An unreadable or malformed cache file is an error naming it (delete it to profile
    /// again).
    pub fn load(&self, key: &ProfileKey) -> Result<Option<ModelProfile>, std::io::Error> {
        let path = self.path(key);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(named(&path, err)),
        };
        let profile: ModelProfile =
            serde_json::from_str(&text).map_err(|err| named(&path, std::io::Error::other(err)))?;
        Ok((profile.key == *key).then_some(profile))
    }

    /// Stores `profile` under its key (written beside, then renamed: never a torn file).
    ///
    /// # Errors
    /// When the directory or file cannot be written.
    pub fn store(&self, profile: &ModelProfile) -> Result<PathBuf, std::io::Error> {
        std::fs::create_dir_all(&self.dir).map_err(|err| named(&self.dir, err))?;
        let path = self.path(&profile.key);
        // One partial file per store: two runs (or threads) storing the same key at once each
        // rename a whole file of their own, and the last one stays.
        static STORES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let store = STORES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = path.with_extension(format!("json.partial-{}-{store}", std::process::id()));
        let text = serde_json::to_string_pretty(profile).expect("a profile serialises");
        let written = std::fs::write(&partial, text)
            .map_err(|err| named(&partial, err))
            .and_then(|()| std::fs::rename(&partial, &path).map_err(|err| named(&path, err)));
        if written.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        written?;
        Ok(path)
    }
}

fn named(path: &Path, err: std::io::Error) -> std::io::Error {
    std::io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}
