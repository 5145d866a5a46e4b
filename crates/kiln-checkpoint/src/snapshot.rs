//! A model's and an optimizer's state as bytes, and back.
//!
//! Weights go in Burn's own module format (burnpack), so a user can load `model.bpk` into the
//! model in plain Burn (`burn_store::BurnpackStore`, `ModuleSnapshot::load_from`). The
//! optimizer's state is Burn's own record too, but keyed by parameter id, and Burn draws ids
//! at random when a model is built: the checkpoint keeps each parameter's id by path, and a
//! resumed model gets the saved ids back before the optimizer state is loaded.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::optim::{ModuleOptimizer, OptimizerRecord};
use burn::tensor::{Bytes, Tensor};
use burn_pack::Writer;
use burn_store::{BurnpackStore, ModuleSnapshot};
use kiln_core::param_infos;

use crate::CheckpointError;

/// `model`'s parameters and buffers in burnpack.
///
/// Burn's running statistics (batch norm) hold their newest update apart until it is read
/// in sync; the saved copy is `model.valid()`, which syncs them, so the file holds every
/// update (the same values the model will compute with).
///
/// The bytes are those `BurnpackStore` writes (tested), encoded straight into one buffer:
/// `BurnpackStore`'s bytes mode builds the container in a buffer of its own, then copies it
/// twice more (3-4x the time here).
///
/// # Panics
/// If Burn cannot encode the module (a bug, not a user error).
pub fn model_bytes<M: Module>(model: &M) -> Vec<u8> {
    let mut writer = Writer::new(model.valid().collect(None, None, false));
    for (key, value) in BurnpackStore::default_metadata() {
        writer = writer.with_metadata(&key, &value);
    }
    encode(writer).expect("Burn encodes a module it holds")
}

/// A burnpack container's bytes, written straight into one buffer of the right size.
///
/// # Errors
/// burnpack's, e.g. a tensor whose bytes are not what its shape says.
pub(crate) fn encode(writer: Writer) -> Result<Vec<u8>, burn_pack::Error> {
    let mut bytes = vec![0u8; writer.size()?];
    writer.write_into(&mut bytes)?;
    Ok(bytes)
}

/// The bytes as a vector: without a copy where the allocation allows it.
fn into_vec(bytes: Bytes) -> Vec<u8> {
    bytes
        .try_into_vec::<u8>()
        .unwrap_or_else(|bytes| bytes.to_vec())
}

/// `model` with every parameter and buffer loaded from `bytes` (from [`model_bytes`] of
/// the same architecture); `path` names the file in errors.
///
/// # Errors
/// [`CheckpointError::Corrupt`] for undecodable bytes, or weights of another architecture
/// (a tensor missing, left over, or of another shape), each named.
pub fn restore_model<M: Module>(model: M, bytes: &[u8], path: &Path) -> Result<M, CheckpointError> {
    let mut model = model;
    let mut store = BurnpackStore::from_bytes(Some(Bytes::from_bytes_vec(bytes.to_vec())));
    let result = model
        .load_from(&mut store)
        .map_err(|err| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("not a burnpack module: {err}"),
        })?;
    let mut problems: Vec<String> = result.errors.iter().map(|e| format!("{e:?}")).collect();
    problems.extend(
        result
            .missing
            .iter()
            .map(|(name, _)| format!("{name} missing")),
    );
    problems.extend(
        result
            .unused
            .iter()
            .map(|name| format!("{name} not in this model")),
    );
    if !problems.is_empty() {
        return Err(CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: format!(
                "weights of another model: {}",
                problems.into_iter().take(5).collect::<Vec<_>>().join("; ")
            ),
        });
    }
    Ok(model)
}

/// Each float parameter's id, by path.
pub fn param_ids<M: Module>(model: &M) -> BTreeMap<String, u64> {
    param_infos(model)
        .into_iter()
        .map(|info| (info.path, info.id.val()))
        .collect()
}

/// `model` with each float parameter's id set to the one `ids` gives its path (ids of
/// paths `ids` does not name stay).
///
/// # Errors
/// [`CheckpointError::Corrupt`] (naming `path`) if `ids` names a path the model lacks.
pub fn assign_param_ids<M: Module>(
    model: M,
    ids: &BTreeMap<String, u64>,
    path: &Path,
) -> Result<M, CheckpointError> {
    let known: HashSet<String> = param_infos(&model).into_iter().map(|i| i.path).collect();
    if let Some(unknown) = ids.keys().find(|k| !known.contains(*k)) {
        return Err(CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("parameter `{unknown}` is not in this model"),
        });
    }
    struct Assign<'a> {
        path: Vec<String>,
        ids: &'a BTreeMap<String, u64>,
    }
    impl ModuleMapper for Assign<'_> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            match self.ids.get(&self.path.join(".")) {
                Some(&id) => {
                    let (_, value, mapper) = param.consume();
                    Param::from_mapped_value(ParamId::from(id), value, mapper)
                }
                None => param,
            }
        }
    }
    Ok(model.map(&mut Assign {
        path: Vec::new(),
        ids,
    }))
}

/// The optimizer's state (Burn's record, keyed by parameter id).
///
/// # Errors
/// [`CheckpointError::Corrupt`] if Burn cannot encode it.
pub fn optimizer_bytes(optimizer: &ModuleOptimizer) -> Result<Vec<u8>, CheckpointError> {
    record_bytes(optimizer.to_record())
}

/// An optimizer record's bytes.
pub(crate) fn record_bytes(record: OptimizerRecord) -> Result<Vec<u8>, CheckpointError> {
    record
        .into_bytes()
        .map(into_vec)
        .map_err(|err| CheckpointError::Corrupt {
            path: "optimizer state".into(),
            reason: err.to_string(),
        })
}

/// `optimizer` with the state from `bytes` (for a model whose ids are the saved ones).
///
/// # Errors
/// [`CheckpointError::Corrupt`] (naming `path`) for undecodable bytes.
pub fn restore_optimizer(
    optimizer: ModuleOptimizer,
    bytes: &[u8],
    path: &Path,
) -> Result<ModuleOptimizer, CheckpointError> {
    optimizer
        .from_bytes(Bytes::from_bytes_vec(bytes.to_vec()))
        .map_err(|err| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("not an optimizer record: {err}"),
        })
}
