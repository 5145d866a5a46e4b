//! Measuring the optimizer's update: what every replica or stage does once per step after
//! its last backward.

use std::time::Instant;

use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Int, Tensor};
use kiln_core::{ImageClassifier, param_infos};
use kiln_train::classification_loss;

use crate::profile::{ProfileError, ProfileOptions, median};

/// Seconds per trainable parameter byte of one `optimizer` step on `model` (the median of
/// `options.runs` steps after one untimed step that creates the optimizer's state, in a pool
/// of `options.threads`), measured on the device of `images` with gradients of a real
/// backward. An update touches each parameter and its state once, so its time is close to
/// proportional to the bytes.
///
/// # Errors
/// [`ProfileError::Input`] for zero runs or a model without trainable parameters;
/// [`ProfileError::Device`] when the device fails.
pub fn profile_update<M: ImageClassifier + Clone + Sync>(
    model: &M,
    images: Tensor<4>,
    labels: Tensor<1, Int>,
    mut optimizer: ModuleOptimizer,
    options: &ProfileOptions,
) -> Result<f64, ProfileError> {
    if let Some(threads) = options.threads {
        let pool = crate::profile::pool(threads)?;
        let options = ProfileOptions {
            threads: None,
            ..options.clone()
        };
        return pool.install(move || profile_update(model, images, labels, optimizer, &options));
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
    let device = images.device();
    let sync = || {
        device.sync().map_err(|err| ProfileError::Device {
            device: format!("{device:?}"),
            message: err.to_string(),
        })
    };
    let mut updated = model.clone();
    let mut times = Vec::with_capacity(runs);
    for run in 0..=runs {
        let loss = classification_loss(updated.forward_logits(images.clone()), labels.clone());
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
