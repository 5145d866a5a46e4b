//! A pipeline's checkpoint: each stage holds only its own parameters (the others emptied)
//! and its optimizer only their state; the stages' parts are joined into one checkpoint of
//! the data-parallel format, so it resumes under any plan (another split, data parallel).
//! Stages in other processes hand their parts over as files (`stage_part_files.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::Bytes;
use burn_pack::{Reader, Writer};
use kiln_train::{StepState, TrainPosition};

use crate::checkpointer::{MODEL_FILE, PARAM_IDS_FILE, STEP_STATE_FILE};
use crate::manifest::Manifest;
use crate::optimizer_parts::optimizer_part_name;
use crate::store::CheckpointStore;
use crate::{CheckpointError, Checkpointer};

/// One pipeline stage's share of a checkpoint, as bytes.
#[derive(Debug, Clone)]
pub struct StagePart {
    /// The stage's module in burnpack ([`model_bytes`](crate::model_bytes)): its own
    /// parameters and buffers whole, every other one empty.
    pub model: Vec<u8>,
    /// Its optimizer's state with its ids' paths
    /// ([`optimizer_part_bytes`](crate::optimizer_part_bytes)).
    pub optimizer: Vec<u8>,
    /// The id of each parameter the stage owns, by path.
    pub ids: BTreeMap<String, u64>,
    /// Its gradient step's state (the loss scaler; every stage holds the same).
    pub step_state: StepState,
}

/// One burnpack module holding, for every tensor, the part whose copy is not empty (a
/// stage's own parameters and buffers); `parts` are `(name, bytes)`, names naming errors.
///
/// # Errors
/// [`CheckpointError::Corrupt`] for a part that is not burnpack, or a tensor two parts both
/// hold whole.
pub fn join_model_parts(parts: &[(String, &[u8])]) -> Result<Vec<u8>, CheckpointError> {
    let mut chosen: BTreeMap<String, (usize, burn_pack::Tensor)> = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    let corrupt = |name: &str, reason: String| CheckpointError::Corrupt {
        path: PathBuf::from(name),
        reason,
    };
    for (index, (name, bytes)) in parts.iter().enumerate() {
        let reader = Reader::from_bytes(Bytes::from_bytes_vec(bytes.to_vec()))
            .map_err(|err| corrupt(name, format!("not a burnpack module: {err}")))?;
        if index == 0 {
            metadata = reader.metadata().clone();
        }
        for tensor in reader
            .into_tensors()
            .map_err(|err| corrupt(name, format!("not a burnpack module: {err}")))?
        {
            let whole = tensor.shape.num_elements() > 0;
            match chosen.get(&tensor.name) {
                Some((other, held)) if whole && held.shape.num_elements() > 0 => {
                    return Err(corrupt(
                        name,
                        format!(
                            "`{}` is held whole by {} too (stages that overlap?)",
                            tensor.name, parts[*other].0
                        ),
                    ));
                }
                Some(_) if !whole => {}
                _ => {
                    chosen.insert(tensor.name.clone(), (index, tensor));
                }
            }
        }
    }
    let mut writer = Writer::new(chosen.into_values().map(|(_, t)| t).collect());
    for (key, value) in &metadata {
        writer = writer.with_metadata(key, value);
    }
    crate::snapshot::encode(writer)
        .map_err(|err| corrupt(MODEL_FILE, format!("joining the stages' modules: {err}")))
}

impl Checkpointer {
    /// What writes a pipeline's checkpoint at `position` from its stages' parts (in stage
    /// order), to run on a thread of its own: the stages' modules joined into `model.bpk`,
    /// their ids into `param_ids.json`, one optimizer part per stage.
    pub fn stage_writer(
        &self,
        position: &TrainPosition,
    ) -> impl FnOnce(Vec<StagePart>) -> Result<PathBuf, CheckpointError> + Send + 'static {
        let (store, mut manifest) = (self.store().clone(), self.manifest(position));
        move |parts| write_stages(&store, &mut manifest, parts)
    }
}

/// Writes the checkpoint of `manifest` from every stage's part (in stage order).
pub(crate) fn write_stages(
    store: &CheckpointStore,
    manifest: &mut Manifest,
    parts: Vec<StagePart>,
) -> Result<PathBuf, CheckpointError> {
    let stages = parts.len();
    let names: Vec<String> = (0..stages).map(|s| format!("stage {s}")).collect();
    let model = join_model_parts(
        &names
            .iter()
            .cloned()
            .zip(parts.iter().map(|p| p.model.as_slice()))
            .collect::<Vec<_>>(),
    )?;
    let ids: BTreeMap<&String, u64> = parts
        .iter()
        .flat_map(|p| &p.ids)
        .map(|(k, v)| (k, *v))
        .collect();
    manifest.optimizer = (0..stages)
        .map(|s| optimizer_part_name(s, stages))
        .collect();
    let mut files = vec![
        (MODEL_FILE.to_string(), model),
        (
            PARAM_IDS_FILE.to_string(),
            serde_json::to_vec_pretty(&ids).expect("ids serialise"),
        ),
        (
            STEP_STATE_FILE.to_string(),
            serde_json::to_vec_pretty(parts.first().map_or(&StepState::Null, |p| &p.step_state))
                .expect("JSON serialises"),
        ),
    ];
    for (name, part) in manifest.optimizer.clone().into_iter().zip(parts) {
        files.push((name, part.optimizer));
    }
    store.save(manifest.clone(), files)
}
