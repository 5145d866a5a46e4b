//! A whole model's profile for the planner: every segment at each of a key's batch sizes,
//! and the optimizer's update — what [`RunPlanning::choose`](crate::RunPlanning::choose)
//! asks of its caller, for any `Segmented` model and objective.

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use kiln_core::{Forward, Segmented};
use kiln_data::Batch;
use kiln_train::Objective;

use crate::{
    BatchProfile, ModelProfile, PlanError, ProfileKey, ProfileOptions, profile_segments_with,
    profile_update_with,
};

impl ProfileKey {
    /// The device to profile on: `device` tracked by autodiff, recomputing activations in
    /// backward when the key says the run will (Burn's gradient checkpointing).
    pub fn training_device(&self, device: &Device) -> Device {
        let device = device.clone().autodiff();
        if self.gradient_checkpointing {
            device.gradient_checkpointing()
        } else {
            device
        }
    }
}

/// Profiles `model` on `device` (its [`ProfileKey::training_device`]) at each of `key`'s
/// batch sizes, cut from `batch` (at least the largest size), with `threads` compute threads,
/// and `optimizer`'s update once per step at the smallest size. Build the model and the
/// batch before any loader runs: on the CPU the kept activations are read from the heap.
///
/// # Errors
/// When `batch` is smaller than the largest size, or profiling fails.
pub fn profile_model<M, O>(
    key: ProfileKey,
    (model, objective): (&M, &O),
    batch: &O::Batch,
    device: &Device,
    optimizer: ModuleOptimizer,
    threads: usize,
) -> Result<ModelProfile, PlanError>
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output>
        + Forward<Input = O::Input, Output = O::Output>
        + Clone
        + Sync,
{
    let largest = key.batches.last().copied().unwrap_or(0);
    if key.batches.is_empty() || batch.samples() < largest {
        return Err(PlanError::Request(format!(
            "profiling: a batch of {} samples for batch sizes {:?}",
            batch.samples(),
            key.batches
        )));
    }
    let batches = key
        .batches
        .iter()
        .enumerate()
        .map(|(i, &size)| -> Result<BatchProfile, PlanError> {
            // The first (smallest) size warms caches and pools up for the others.
            let options = ProfileOptions {
                threads: Some(threads),
                warmup: usize::from(i == 0),
                ..ProfileOptions::default()
            };
            let part = batch.slice(0..size);
            Ok(profile_segments_with(
                model, objective, &part, device, &options,
            )?)
        })
        .collect::<Result<_, _>>()?;
    let options = ProfileOptions {
        threads: Some(threads),
        ..ProfileOptions::default()
    };
    let smallest = batch.slice(0..key.batches[0]);
    let update_seconds_per_byte =
        profile_update_with(model, (objective, &smallest), device, optimizer, &options)?;
    Ok(ModelProfile {
        key,
        batches,
        update_seconds_per_byte,
    })
}
