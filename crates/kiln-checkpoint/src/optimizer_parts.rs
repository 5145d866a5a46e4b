//! An optimizer's state in parts (ZeRO-1 shards), joined and re-cut.
//!
//! Burn's optimizer record is a burnpack whose entries are keyed per parameter: tensors named
//! `"{id}.{field}"` carrying the parameter id, scalars `"{id}.{field}"` and a path per id in
//! the metadata. Under ZeRO-1 each replica's optimizer holds the state of the parameters it
//! owns only, so the union of the replicas' records is exactly the record one optimizer
//! holding every parameter would have. A checkpoint stores one part per replica; a resume
//! joins them (whatever the number of parts) and keeps what the resuming replica owns, so
//! a run continues on another replica count, with or without ZeRO-1.
//!
//! Burn draws parameter ids at random, so each replica's model has ids of its own: a part
//! carries its own ids' paths (metadata `kiln.path.{id}`), and joining re-keys every entry
//! to the ids the checkpoint's model has at those paths.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use burn::optim::OptimizerRecord;
use burn::tensor::Bytes;
use burn_pack::{Reader, Writer};

use crate::CheckpointError;

/// The metadata prefix of a part's own parameter paths, by id.
const PATH_KEY: &str = "kiln.path.";

/// The name of replica `rank`'s part of an optimizer state sharded over `world` replicas.
pub fn optimizer_part_name(rank: usize, world: usize) -> String {
    format!("optimizer-{rank}-of-{world}.bpk")
}

/// The parameter id an optimizer record's scalar or metadata key belongs to (`"17.__rank"`,
/// `"17"`), if it is keyed by one.
fn key_id(key: &str) -> Option<u64> {
    key.split('.').next().and_then(|id| id.parse().ok())
}

/// `key` keyed by `id` instead of the id it starts with.
fn rekey(key: &str, id: u64) -> String {
    match key.split_once('.') {
        Some((_, rest)) => format!("{id}.{rest}"),
        None => id.to_string(),
    }
}

/// A replica's part of the optimizer's state as bytes: Burn's record, with the paths of the
/// replica's parameter ids (`ids`: id by path) so that joining can re-key it.
///
/// # Errors
/// [`CheckpointError::Corrupt`] if Burn cannot encode the record.
pub fn optimizer_part_bytes(
    record: OptimizerRecord,
    ids: &BTreeMap<String, u64>,
) -> Result<Vec<u8>, CheckpointError> {
    let corrupt = |err: String| CheckpointError::Corrupt {
        path: "optimizer state".into(),
        reason: err,
    };
    let bytes = record
        .into_bytes()
        .map_err(|err| corrupt(err.to_string()))?;
    let reader = Reader::from_bytes(bytes).map_err(|err| corrupt(err.to_string()))?;
    let (scalars, metadata) = (reader.scalars().clone(), reader.metadata().clone());
    let mut writer = Writer::new(reader.into_tensors().map_err(|e| corrupt(e.to_string()))?);
    for (key, value) in &scalars {
        writer = writer.with_scalar(key, *value);
    }
    for (key, value) in &metadata {
        writer = writer.with_metadata(key, value);
    }
    for (path, id) in ids {
        writer = writer.with_metadata(&format!("{PATH_KEY}{id}"), path);
    }
    crate::snapshot::encode(writer).map_err(|err| corrupt(err.to_string()))
}

/// One optimizer record holding every part's entries, re-keyed to the ids `ids` gives each
/// path (the checkpoint's model's), keeping only the parameters `keep` names (all with
/// `None`); `parts` are `(file, bytes)`, the file naming errors. A part without paths (an
/// optimizer that was not sharded) is keyed by `ids` already.
///
/// # Errors
/// [`CheckpointError::Corrupt`] naming the part that is not a burnpack record, names a path
/// `ids` lacks, or holds state for a parameter another part holds too.
pub fn join_optimizer_parts(
    parts: &[(&Path, &[u8])],
    ids: &BTreeMap<String, u64>,
    keep: Option<&HashSet<u64>>,
) -> Result<Vec<u8>, CheckpointError> {
    let kept = |id: Option<u64>| match (keep, id) {
        (None, _) => true,
        (Some(keep), Some(id)) => keep.contains(&id),
        // Entries of no parameter (none in Burn's records today) go with every part.
        (Some(_), None) => true,
    };
    let mut tensors = Vec::new();
    let mut scalars = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    let mut owner: BTreeMap<u64, &Path> = BTreeMap::new();
    for &(path, bytes) in parts {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let reader = Reader::from_bytes(Bytes::from_bytes_vec(bytes.to_vec()))
            .map_err(|err| corrupt(format!("not an optimizer record: {err}")))?;
        // This part's ids -> the checkpoint's, through the paths (none: the same ids).
        let mut remap = HashMap::new();
        for (key, path) in reader.metadata() {
            let Some(own) = key
                .strip_prefix(PATH_KEY)
                .and_then(|id| id.parse::<u64>().ok())
            else {
                continue;
            };
            let id = *ids.get(path).ok_or_else(|| {
                corrupt(format!(
                    "state for parameter `{path}`, which the model lacks"
                ))
            })?;
            remap.insert(own, id);
        }
        let to_checkpoint = |own: u64| remap.get(&own).copied().unwrap_or(own);
        let mut held = HashSet::new();
        for (key, value) in reader.scalars() {
            let id = key_id(key).map(to_checkpoint);
            if kept(id) {
                held.extend(id);
                let key = id.map_or_else(|| key.clone(), |id| rekey(key, id));
                scalars.insert(key, *value);
            }
        }
        for (key, value) in reader.metadata() {
            let id = key_id(key).map(to_checkpoint);
            if !key.starts_with(PATH_KEY) && kept(id) {
                let key = id.map_or_else(|| key.clone(), |id| rekey(key, id));
                metadata.insert(key, value.clone());
            }
        }
        for tensor in reader
            .into_tensors()
            .map_err(|err| corrupt(format!("not an optimizer record: {err}")))?
        {
            let id = tensor.param_id.map(to_checkpoint);
            if kept(id) {
                held.extend(id);
                let (name, dtype, shape, _, bytes) = tensor
                    .into_parts()
                    .map_err(|err| corrupt(format!("not an optimizer record: {err}")))?;
                let name = id.map_or(name.clone(), |id| rekey(&name, id));
                tensors.push(burn_pack::Tensor::new(name, dtype, shape, id, bytes));
            }
        }
        for id in held {
            if let Some(other) = owner.insert(id, path) {
                return Err(corrupt(format!(
                    "holds state for parameter {id}, which {} holds too (parts of different runs?)",
                    other.display()
                )));
            }
        }
    }
    let mut writer = Writer::new(tensors);
    for (key, value) in &scalars {
        writer = writer.with_scalar(key, *value);
    }
    for (key, value) in &metadata {
        writer = writer.with_metadata(key, value);
    }
    crate::snapshot::encode(writer).map_err(|err| CheckpointError::Corrupt {
        path: parts
            .first()
            .map_or_else(|| "optimizer state".into(), |(p, _)| p.to_path_buf()),
        reason: format!("joining the optimizer's parts: {err}"),
    })
}
