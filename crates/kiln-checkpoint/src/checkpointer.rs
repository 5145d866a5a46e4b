//! Saving a training run's checkpoints, and resuming from one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use kiln_train::{CheckpointHook, TrainError, TrainPosition};

use crate::CheckpointError;
use crate::manifest::{FORMAT, Manifest, RunIdentity};
use crate::snapshot::{
    assign_param_ids, model_bytes, optimizer_bytes, param_ids, restore_model, restore_optimizer,
};
use crate::store::CheckpointStore;

/// The model's weights, in Burn's burnpack format (loadable in plain Burn).
pub const MODEL_FILE: &str = "model.bpk";
/// The optimizer's state, Burn's optimizer record.
pub const OPTIMIZER_FILE: &str = "optimizer.bpk";
/// Each parameter's id by path (the optimizer record is keyed by id).
pub const PARAM_IDS_FILE: &str = "param_ids.json";

/// Saves a run's checkpoints into a [`CheckpointStore`] every `every` optimizer steps and
/// after the last one; give it to [`TrainerBuilder::checkpoint`](kiln_train::TrainerBuilder::checkpoint)
/// of every replica, writing on one ([`writes`](Self::writes)).
#[derive(Debug, Clone)]
pub struct Checkpointer {
    store: CheckpointStore,
    every: usize,
    identity: RunIdentity,
    layout: BTreeMap<String, String>,
    writes: bool,
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
        }
    }

    /// Whether this replica writes (default) or only takes part: with several replicas each
    /// has a checkpointer deciding alike, and one writes (they hold the same state).
    pub fn writes(mut self, writes: bool) -> Self {
        self.writes = writes;
        self
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
        let ids = serde_json::to_vec_pretty(&param_ids(model)).expect("ids serialise");
        let files = vec![
            (MODEL_FILE.to_string(), model_bytes(model)),
            (OPTIMIZER_FILE.to_string(), optimizer_bytes(optimizer)?),
            (PARAM_IDS_FILE.to_string(), ids),
        ];
        let manifest = Manifest {
            format: FORMAT,
            kiln: env!("CARGO_PKG_VERSION").into(),
            run: self.identity.clone(),
            layout: self.layout.clone(),
            position: (*position).into(),
            files: Vec::new(),
        };
        self.store.save(manifest, files)
    }
}

impl<M: Module> CheckpointHook<M> for Checkpointer {
    fn should_save(&self, position: &TrainPosition, finished: bool) -> bool {
        finished || (self.every > 0 && position.step.is_multiple_of(self.every))
    }

    fn save(
        &mut self,
        position: &TrainPosition,
        model: &M,
        optimizer: &ModuleOptimizer,
    ) -> Result<(), TrainError> {
        if !self.writes {
            return Ok(());
        }
        self.save_now(position, model, optimizer)
            .map(|_| ())
            .map_err(|err| TrainError::Checkpoint(err.to_string()))
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
    /// The checkpoint.
    pub path: PathBuf,
}

/// Restores `model` (built as for a fresh run, on its training device) and `optimizer`
/// (fresh) from the checkpoint in `path`, after checking every file against the manifest
/// and the run against `identity`.
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
    let model = restore_model(model, loaded.file(MODEL_FILE)?, &path.join(MODEL_FILE))?;
    let model = assign_param_ids(model, &ids, &ids_path)?;
    let optimizer = restore_optimizer(
        optimizer,
        loaded.file(OPTIMIZER_FILE)?,
        &path.join(OPTIMIZER_FILE),
    )?;
    Ok(Resumed {
        model,
        optimizer,
        position: loaded.manifest.position.into(),
        path: path.to_path_buf(),
    })
}
