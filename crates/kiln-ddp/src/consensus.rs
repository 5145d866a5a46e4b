//! Keeping replicas' parameters and buffers consistent.

use burn::module::Module;
use kiln_comm::{CommError, CommWorker, ReduceOp};
use kiln_core::{FlatLayout, fingerprint_values, param_infos, read_params, write_params};
use kiln_train::TrainError;

/// Which float tensors of a module to move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Selection {
    /// Parameters and buffers.
    All,
    /// Buffers only (batch-norm running statistics: the non-trainable tensors).
    Buffers,
    /// Trainable parameters only.
    Trainable,
}

fn selected<M: Module>(module: &M, selection: Selection) -> Vec<kiln_core::ParamInfo> {
    param_infos(module)
        .into_iter()
        .filter(|p| match selection {
            Selection::All => true,
            Selection::Buffers => !p.trainable,
            Selection::Trainable => p.trainable,
        })
        .collect()
}

fn layout<M: Module>(module: &M, selection: Selection) -> FlatLayout {
    FlatLayout::new(selected(module, selection))
}

/// Replaces every replica's values with rank 0's.
pub(crate) fn broadcast<M: Module>(
    comm: &CommWorker,
    module: M,
    selection: Selection,
) -> Result<M, CommError> {
    let layout = layout(&module, selection);
    let values = read_params(&module, &layout);
    let values = comm.run(move |c| {
        let mut values = values;
        c.broadcast(&mut values, 0).map(|_| values)
    })?;
    Ok(write_params(module, &layout, &values))
}

/// Replaces every replica's values with the mean over replicas (nothing to do for one).
pub(crate) fn average<M: Module>(
    comm: &CommWorker,
    module: M,
    selection: Selection,
) -> Result<M, CommError> {
    if comm.world_size() == 1 {
        return Ok(module);
    }
    let layout = layout(&module, selection);
    if layout.is_empty() {
        return Ok(module);
    }
    let values = read_params(&module, &layout);
    let values = comm.all_reduce_values(values, ReduceOp::Mean)?;
    Ok(write_params(module, &layout, &values))
}

/// Replaces every replica's buffers (batch-norm running statistics) with their mean over
/// replicas, so that all replicas evaluate and checkpoint the same model (kiln's own
/// synchronous step does this after every step).
pub fn average_buffers<M: Module>(comm: &CommWorker, module: M) -> Result<M, CommError> {
    average(comm, module, Selection::Buffers)
}

/// A 64-bit fingerprint as four exactly representable `f32` (16 bits each).
fn to_words(hash: u64) -> [f32; 4] {
    std::array::from_fn(|i| ((hash >> (16 * i)) & 0xFFFF) as f32)
}

/// Checks that every replica holds bit-identical parameters and buffers.
///
/// Each replica fingerprints each tensor; the fingerprints are all-gathered and compared
/// with rank 0's. A mismatch names the first differing tensor (in declaration order) and
/// the ranks that differ from rank 0.
pub(crate) fn check_divergence<M: Module>(
    comm: &CommWorker,
    module: &M,
    selection: Selection,
) -> Result<(), TrainError> {
    let infos = selected(module, selection);
    let layout = FlatLayout::new(infos.clone());
    let values = read_params(module, &layout);
    let words: Vec<f32> = layout
        .entries()
        .iter()
        .flat_map(|e| {
            to_words(fingerprint_values(
                &values[e.offset..e.offset + e.info.numel()],
            ))
        })
        .collect();
    let world = comm.world_size();
    let per_rank = words.len();
    let gathered = comm.run(move |c| {
        let mut all = vec![0.0f32; per_rank * world];
        c.all_gather(&words, &mut all).map(|_| all)
    })?;
    let (reference, others) = gathered.split_at(per_rank);
    for (index, info) in infos.iter().enumerate() {
        let expected = &reference[4 * index..4 * index + 4];
        let differing: Vec<usize> = others
            .chunks(per_rank)
            .enumerate()
            .filter(|(_, rank_words)| &rank_words[4 * index..4 * index + 4] != expected)
            .map(|(r, _)| r + 1)
            .collect();
        if !differing.is_empty() {
            return Err(TrainError::Diverged(format!(
                "`{}` differs from rank 0 on rank(s) {differing:?}",
                info.path
            )));
        }
    }
    Ok(())
}
