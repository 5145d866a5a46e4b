//! Saving a training run's checkpoints, and resuming from one.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use kiln_train::{CheckpointHook, StepState, TrainError, TrainPosition};

use crate::CheckpointError;
use crate::manifest::{FORMAT, Manifest, RunIdentity};
use crate::optimizer_parts::{join_optimizer_parts, optimizer_part_bytes, optimizer_part_name};
use crate::parts::PartsToCollect;
use crate::snapshot::{
    assign_param_ids, model_bytes, param_ids, record_bytes, restore_model, restore_optimizer,
};
use crate::store::CheckpointStore;

/// A checkpoint's files by name, in memory.
type Files = Vec<(String, Vec<u8>)>;

/// The model's weights, in Burn's burnpack format (loadable in plain Burn).
pub const MODEL_FILE: &str = "model.bpk";
/// The optimizer's state, Burn's optimizer record.
pub const OPTIMIZER_FILE: &str = "optimizer.bpk";
/// Each parameter's id by path (the optimizer record is keyed by id).
pub const PARAM_IDS_FILE: &str = "param_ids.json";
/// The gradient step's state (the loss scaler), JSON.
pub const STEP_STATE_FILE: &str = "step_state.json";

/// Saves a run's checkpoints into a [`CheckpointStore`] every `every` optimizer steps and
/// after the last one; give it to [`TrainerBuilder::checkpoint`](kiln_train::TrainerBuilder::checkpoint)
/// of every replica, writing on one ([`writes`](Self::writes)).
///
/// As the trainer's hook it takes hold of the state on the training thread (the model's
/// tensors, which Burn never changes in place while held, and the optimizer's record) and
/// encodes and writes it on a thread of its own, so training goes on during the write; a
/// save waits for the previous write, and training ends only when the last write is on
/// disk (an error of a background write stops training at the next save or at the end).
///
/// With the optimizer's state sharded over replicas (ZeRO-1,
/// [`optimizer_shard`](Self::optimizer_shard)), every replica saves its part and the writing
/// replica's checkpoint counts only once every part is in it.
#[derive(Debug)]
pub struct Checkpointer {
    store: CheckpointStore,
    every: usize,
    identity: RunIdentity,
    layout: BTreeMap<String, String>,
    writes: bool,
    shard: Option<Shard>,
    part_timeout: Duration,
    abandoned: Arc<AtomicBool>,
    writing: Option<std::thread::JoinHandle<Result<PathBuf, CheckpointError>>>,
}

/// This replica's place among those whose optimizers each hold a part of the state.
#[derive(Debug, Clone, Copy)]
struct Shard {
    rank: usize,
    world: usize,
}

impl Checkpointer {
    /// Checkpoints of the run `identity` into `store` every `every` steps (0: only at the
    /// end).
    pub fn new(store: CheckpointStore, every: usize, identity: RunIdentity) -> Self {
        Self {
            store,
            every,
            identity,
            layout: BTreeMap::new(),
            writes: true,
            shard: None,
            part_timeout: Duration::from_secs(300),
            abandoned: Arc::default(),
            writing: None,
        }
    }

    /// This replica's optimizer holds part `rank` of `world` of the optimizer's state
    /// (ZeRO-1): every replica saves its part, the writing one collects them all before
    /// its checkpoint counts. Removes parts an earlier, interrupted run left behind, so
    /// call it before this run's replicas train (as building the trainer does).
    ///
    /// # Panics
    /// If `rank >= world` (a programmer error).
    pub fn optimizer_shard(mut self, rank: usize, world: usize) -> Self {
        assert!(rank < world, "rank {rank} of {world} replicas");
        if world > 1 {
            self.store.remove_stale_parts();
            self.shard = Some(Shard { rank, world });
        }
        self
    }

    /// How long the writing replica waits for another replica's part (default 300 s).
    pub fn part_timeout(mut self, timeout: Duration) -> Self {
        self.part_timeout = timeout;
        self
    }

    /// Whether this replica writes (default) or only takes part: with several replicas each
    /// has a checkpointer deciding alike, and one writes (they hold the same state).
    pub fn writes(mut self, writes: bool) -> Self {
        self.writes = writes;
        self
    }

    /// This checkpointer as replica `rank`'s of `world` data-parallel replicas: every replica
    /// takes part in each checkpoint and the first writes it (they hold the same model);
    /// with `sharded_optimizer` (ZeRO-1) each saves its part of the optimizer's state and
    /// the first collects them (see [`optimizer_shard`](Self::optimizer_shard)).
    ///
    /// # Panics
    /// If `rank >= world` (a programmer error).
    pub fn for_replica(self, rank: usize, world: usize, sharded_optimizer: bool) -> Self {
        assert!(rank < world, "rank {rank} of {world} replicas");
        let saver = self.writes(rank == 0);
        if sharded_optimizer {
            saver.optimizer_shard(rank, world)
        } else {
            saver
        }
    }

    /// Records how the run is laid out (devices, replicas, plan) in the manifest; it may
    /// differ when resuming.
    pub fn layout(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.layout.insert(name.into(), value.to_string());
        self
    }

    /// The store it writes into.
    pub fn store(&self) -> &CheckpointStore {
        &self.store
    }

    /// Writes a checkpoint of `model` and `optimizer` at `position` now.
    ///
    /// # Errors
    /// As [`CheckpointStore::save`].
    pub fn save_now<M: Module>(
        &self,
        position: &TrainPosition,
        model: &M,
        optimizer: &ModuleOptimizer,
    ) -> Result<PathBuf, CheckpointError> {
        let (manifest, files) = self
            .hold(position, model, optimizer, StepState::Null)
            .encode(OPTIMIZER_FILE.into())?;
        self.store.save(manifest, files)
    }

    /// Takes hold of the state to save at `position` (no copy of the model's tensors).
    fn hold<M: Module>(
        &self,
        position: &TrainPosition,
        model: &M,
        optimizer: &ModuleOptimizer,
        step_state: StepState,
    ) -> Held<M> {
        Held {
            model: model.valid(),
            optimizer: optimizer.to_record(),
            step_state,
            manifest: self.manifest(position),
        }
    }

    /// Whether a checkpoint is due after `position` (`finished`: the run's last step).
    pub fn is_due(&self, position: &TrainPosition, finished: bool) -> bool {
        finished || (self.every > 0 && position.step.is_multiple_of(self.every))
    }

    /// The files holding the optimizer's state: one per replica when it is sharded.
    fn optimizer_files(&self) -> Vec<String> {
        match self.shard {
            Some(Shard { world, .. }) => {
                (0..world).map(|r| optimizer_part_name(r, world)).collect()
            }
            None => vec![OPTIMIZER_FILE.to_string()],
        }
    }

    /// The manifest of a checkpoint at `position` (its files listed when written).
    pub(crate) fn manifest(&self, position: &TrainPosition) -> Manifest {
        Manifest {
            format: FORMAT,
            kiln: env!("CARGO_PKG_VERSION").into(),
            run: self.identity.clone(),
            layout: self.layout.clone(),
            position: (*position).into(),
            files: Vec::new(),
            optimizer: self.optimizer_files(),
        }
    }

    /// Waits for the background write, if one is under way.
    ///
    /// # Errors
    /// That write's error.
    pub fn wait(&mut self) -> Result<Option<PathBuf>, CheckpointError> {
        match self.writing.take() {
            None => Ok(None),
            Some(handle) => match handle.join() {
                Ok(result) => result.map(Some),
                Err(_) => Err(CheckpointError::Corrupt {
                    path: self.store.dir().to_path_buf(),
                    reason: "the checkpoint writer panicked".into(),
                }),
            },
        }
    }
}

/// A checkpoint's state held in memory: the model's values (Burn tensors are immutable, so
/// holding them costs no copy while training goes on) and the optimizer's record.
struct Held<M> {
    model: M,
    optimizer: burn::optim::OptimizerRecord,
    step_state: StepState,
    manifest: Manifest,
}

impl<M: Module> Held<M> {
    /// The files of the checkpoint; `optimizer_file` holds the optimizer's state (or this
    /// replica's part of it).
    fn encode(self, optimizer_file: String) -> Result<(Manifest, Files), CheckpointError> {
        let ids = serde_json::to_vec_pretty(&param_ids(&self.model)).expect("ids serialise");
        let files = vec![
            (MODEL_FILE.to_string(), model_bytes(&self.model)),
            (optimizer_file, record_bytes(self.optimizer)?),
            (PARAM_IDS_FILE.to_string(), ids),
            (
                STEP_STATE_FILE.to_string(),
                serde_json::to_vec_pretty(&self.step_state).expect("JSON serialises"),
            ),
        ];
        Ok((self.manifest, files))
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // A checkpoint being written is finished before the run lets go of it; dropped
        // without `finish` (training failed), it waits for no other replica's part.
        self.abandoned.store(true, Ordering::Release);
        let _ = self.wait();
    }
}

impl<M: Module + Send + 'static> CheckpointHook<M> for Checkpointer {
    fn should_save(&self, position: &TrainPosition, finished: bool) -> bool {
        self.is_due(position, finished)
    }

    fn save(
        &mut self,
        position: &TrainPosition,
        model: &M,
        optimizer: &ModuleOptimizer,
        step_state: &StepState,
    ) -> Result<(), TrainError> {
        let shard = self.shard;
        if !self.writes && shard.is_none() {
            return Ok(());
        }
        self.wait().map_err(TrainError::checkpoint)?;
        let store = self.store.clone();
        let step = position.step;
        let write: Box<dyn FnOnce() -> Result<PathBuf, CheckpointError> + Send> = match shard {
            // Another replica's part: its optimizer's state only, collected by the writer.
            Some(Shard { rank, world }) if !self.writes => {
                let (record, ids) = (optimizer.to_record(), param_ids(model));
                Box::new(move || {
                    let name = optimizer_part_name(rank, world);
                    store.save_part(step, &name, &optimizer_part_bytes(record, &ids)?)?;
                    Ok(store.path_for(step))
                })
            }
            _ => {
                // Held on this thread (references to the model's tensors, the
                // optimizer's record); encoded, checksummed and written on the writer's.
                let held = self.hold(position, model, optimizer, step_state.clone());
                // This replica's own file, and the other replicas' parts to wait for.
                let mut names = self.optimizer_files();
                let own = names.remove(shard.map_or(0, |s| s.rank));
                let parts = shard.map(|_| PartsToCollect {
                    names,
                    timeout: self.part_timeout,
                    abandoned: Arc::clone(&self.abandoned),
                });
                Box::new(move || {
                    let (manifest, files) = held.encode(own)?;
                    store.save_with_parts(manifest, files, parts.as_ref())
                })
            }
        };
        self.writing = Some(
            std::thread::Builder::new()
                .name("kiln-checkpoint-writer".into())
                .spawn(write)
                .map_err(|err| TrainError::checkpoint(format!("starting the writer: {err}")))?,
        );
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TrainError> {
        self.wait().map(|_| ()).map_err(TrainError::checkpoint)
    }
}

/// A run restored from a checkpoint: give the model, optimizer and position to the trainer
/// ([`TrainerBuilder::resume_at`](kiln_train::TrainerBuilder::resume_at)).
pub struct Resumed<M> {
    /// The model with the checkpoint's weights (and parameter ids).
    pub model: M,
    /// The optimizer with the checkpoint's state.
    pub optimizer: ModuleOptimizer,
    /// Where the run stood.
    pub position: TrainPosition,
    /// The gradient step's state (give it to `GradientStep::restore_state`).
    pub step_state: StepState,
    /// The checkpoint.
    pub path: PathBuf,
}

/// Restores `model` (built as for a fresh run, on its training device) and `optimizer`
/// (fresh) from the checkpoint in `path`, after checking every file against the manifest
/// and the run against `identity`. The optimizer gets the state of every parameter, joined
/// from its parts if the run that saved it sharded it (ZeRO-1) over any number of replicas.
///
/// # Errors
/// [`CheckpointError::Missing`], [`CheckpointError::Corrupt`] naming the file, or
/// [`CheckpointError::Mismatch`] naming every difference; nothing is restored then.
pub fn resume<M: Module>(
    path: &Path,
    identity: &RunIdentity,
    model: M,
    optimizer: ModuleOptimizer,
) -> Result<Resumed<M>, CheckpointError> {
    restore(path, identity, model, optimizer, None)
}

/// [`resume`] for a replica whose optimizer keeps the state of some parameters only (a
/// ZeRO-1 shard): the optimizer gets the state of the parameters at the paths `owned`
/// names, whatever the number of replicas (and whether ZeRO-1 was on) when it was saved.
///
/// # Errors
/// As [`resume`], and [`CheckpointError::Corrupt`] if `owned` names a path the checkpoint
/// has no parameter at.
pub fn resume_owning<M: Module>(
    path: &Path,
    identity: &RunIdentity,
    model: M,
    optimizer: ModuleOptimizer,
    owned: &[String],
) -> Result<Resumed<M>, CheckpointError> {
    restore(path, identity, model, optimizer, Some(owned))
}

fn restore<M: Module>(
    path: &Path,
    identity: &RunIdentity,
    model: M,
    optimizer: ModuleOptimizer,
    owned: Option<&[String]>,
) -> Result<Resumed<M>, CheckpointError> {
    let loaded = CheckpointStore::load(path)?;
    let differences = identity.differences(&loaded.manifest.run);
    if !differences.is_empty() {
        return Err(CheckpointError::Mismatch {
            path: path.to_path_buf(),
            differences: differences.join("; "),
        });
    }
    let ids_path = path.join(PARAM_IDS_FILE);
    let ids: BTreeMap<String, u64> =
        serde_json::from_slice(loaded.file(PARAM_IDS_FILE)?).map_err(|err| {
            CheckpointError::Corrupt {
                path: ids_path.clone(),
                reason: err.to_string(),
            }
        })?;
    let keep = owned
        .map(|paths| {
            paths
                .iter()
                .map(|p| {
                    ids.get(p).copied().ok_or_else(|| CheckpointError::Corrupt {
                        path: ids_path.clone(),
                        reason: format!("no parameter at `{p}`, which this replica owns"),
                    })
                })
                .collect::<Result<HashSet<u64>, _>>()
        })
        .transpose()?;
    let model = restore_model(model, loaded.file(MODEL_FILE)?, &path.join(MODEL_FILE))?;
    let model = assign_param_ids(model, &ids, &ids_path)?;
    let mut names = loaded.manifest.optimizer.clone();
    if names.is_empty() {
        names.push(OPTIMIZER_FILE.into());
    }
    let paths: Vec<PathBuf> = names.iter().map(|n| path.join(n)).collect();
    let parts = names
        .iter()
        .zip(&paths)
        .map(|(name, file)| Ok((file.as_path(), loaded.file(name)?)))
        .collect::<Result<Vec<_>, CheckpointError>>()?;
    let state = if parts.len() == 1 && keep.is_none() {
        parts[0].1.to_vec()
    } else {
        join_optimizer_parts(&parts, &ids, keep.as_ref())?
    };
    let optimizer = restore_optimizer(optimizer, &state, &paths[0])?;
    // Checkpoints of older builds have no step state: none then.
    let step_state = match loaded.files.get(STEP_STATE_FILE) {
        Some(bytes) => serde_json::from_slice(bytes).map_err(|err| CheckpointError::Corrupt {
            path: path.join(STEP_STATE_FILE),
            reason: err.to_string(),
        })?,
        None => StepState::Null,
    };
    Ok(Resumed {
        model,
        optimizer,
        step_state,
        position: loaded.manifest.position.into(),
        path: path.to_path_buf(),
    })
}
