//! A model's training throughput measured on its device: what uneven data-parallel batches
//! are sized by (kiln-ddp's `Replica::split_batch`).

use std::time::Instant;

use burn::tensor::Device;
use kiln_amp::MixedPrecision;
use kiln_core::Forward;
use kiln_data::Batch;

use crate::{Objective, TrainError, forward_backward_with};

/// Training samples per second of `model` (its master weights; the working copy is made
/// here) for `objective` in `precision`: forward and backward of each of `batches` on
/// `device`, waiting for the device after each. The first batch is not timed — it pays for
/// kernel compilation, tuning and first-touch allocation.
///
/// ```
/// use burn::module::Module;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::{Device, Tensor};
/// use kiln_amp::MixedPrecision;
/// use kiln_data::{DataLoader, SyntheticImages};
/// use kiln_train::{Classification, measure_throughput};
///
/// #[derive(Module, Debug)]
/// struct Flat {
///     head: Linear,
/// }
///
/// impl kiln_core::ImageClassifier for Flat {
///     fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
///         self.head.forward(images.flatten::<2>(1, 3))
///     }
/// }
///
/// let device = Device::flex().autodiff();
/// let model = kiln_core::init_module(&device, 0, || Flat {
///     head: LinearConfig::new(48, 10).init(&device),
/// });
/// let mut loader = DataLoader::builder(SyntheticImages::new(64, 10, 3, [3, 4, 4]))
///     .batch_size(16)
///     .device(device.clone())
///     .build();
/// let batches = loader.epoch(0).take(4).collect::<Result<Vec<_>, _>>()?;
/// let precision = MixedPrecision::f32();
/// let samples_per_second =
///     measure_throughput(&model, &Classification, batches, &precision, &device)?;
/// assert!(samples_per_second > 0.0);
/// // One batch would time nothing: refused.
/// assert!(measure_throughput(&model, &Classification, Vec::new(), &precision, &device).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`TrainError::Config`] with fewer than two batches (nothing would be timed), and
/// [`TrainError::Device`] when the device fails.
pub fn measure_throughput<M, O>(
    model: &M,
    objective: &O,
    batches: Vec<O::Batch>,
    precision: &MixedPrecision,
    device: &Device,
) -> Result<f64, TrainError>
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
{
    if batches.len() < 2 {
        return Err(TrainError::Config(format!(
            "measuring throughput needs at least two batches (the first is not timed), got {}",
            batches.len()
        )));
    }
    let working = precision.working_copy(model);
    let working = working.as_ref().unwrap_or(model);
    let (mut seconds, mut samples) = (0.0, 0);
    for (index, batch) in batches.into_iter().enumerate() {
        let size = batch.samples();
        let start = Instant::now();
        drop(forward_backward_with(working, objective, batch, precision));
        device
            .sync()
            .map_err(|err| TrainError::Device(format!("{device:?}: {err}")))?;
        if index > 0 {
            seconds += start.elapsed().as_secs_f64();
            samples += size;
        }
    }
    Ok(samples as f64 / seconds.max(1e-9))
}
