//! Measuring the optimizer's update: what every replica or stage does once per step after
//! its last backward.

use std::time::Instant;

use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor};
use kiln_core::{Forward, ImageClassifier, param_infos};
use kiln_train::{Classification, Objective, objective_loss};

use crate::profile::{ProfileError, ProfileOptions, image_batch, median};

/// Seconds per trainable parameter byte of one `optimizer` step on the image classifier
/// `model`, measured on the device of `images` with gradients of cross-entropy against
/// `labels`: [`profile_update_with`] for [`Classification`].
///
/// # Errors
/// As [`profile_update_with`].
pub fn profile_update<M: ImageClassifier + Clone + Sync>(
    model: &M,
    images: Tensor<4>,
    labels: Tensor<1, Int>,
    optimizer: ModuleOptimizer,
    options: &ProfileOptions,
) -> Result<f64, ProfileError> {
    let device = images.device();
    let batch = image_batch(images, labels);
    profile_update_with(
        model,
        (&Classification, &batch),
        &device,
        optimizer,
        options,
    )
}

/// Seconds per trainable parameter byte of one `optimizer` step on `model` (the median of
/// `options.runs` steps after one untimed step that creates the optimizer's state, in a pool
/// of `options.threads`), measured on `device` (the batch's) with gradients of a real
/// backward of the objective on the batch. An update touches each parameter and its state
/// once, so its time is close to proportional to the bytes.
///
/// # Errors
/// [`ProfileError::Input`] for zero runs or a model without trainable parameters;
/// [`ProfileError::Device`] when the device fails.
pub fn profile_update_with<M, O>(
    model: &M,
    (objective, batch): (&O, &O::Batch),
    device: &Device,
    mut optimizer: ModuleOptimizer,
    options: &ProfileOptions,
) -> Result<f64, ProfileError>
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output> + Clone + Sync,
{
    if let Some(threads) = options.threads {
        let pool = crate::profile::pool(threads)?;
        let options = ProfileOptions {
            threads: None,
            ..options.clone()
        };
        // The pool's thread takes its own handles (a batch need not be `Sync`).
        let (batch, device) = (batch.clone(), device.clone());
        return pool.install(move || {
            profile_update_with(model, (objective, &batch), &device, optimizer, &options)
        });
    }
    let runs = options.runs;
    let bytes: usize = param_infos(model)
        .iter()
        .filter(|info| info.trainable)
        .map(|info| 4 * info.numel())
        .sum();
    if runs == 0 || bytes == 0 {
        return Err(ProfileError::Input(format!(
            "an update profile needs runs and trainable parameters (runs {runs}, {bytes} bytes)"
        )));
    }
    let sync = || {
        device.sync().map_err(|err| ProfileError::Device {
            device: format!("{device:?}"),
            message: err.to_string(),
        })
    };
    let mut updated = model.clone();
    let mut times = Vec::with_capacity(runs);
    for run in 0..=runs {
        let output = updated.forward(objective.input(batch));
        let loss = objective_loss(objective, &output, batch);
        let grads = GradientsParams::from_grads(loss.backward(), &updated);
        sync()?;
        let start = Instant::now();
        updated = optimizer.step(1e-6, updated, grads);
        sync()?;
        if run > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(median(times) / bytes as f64)
}
