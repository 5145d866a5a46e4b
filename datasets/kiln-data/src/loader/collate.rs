//! Reading, transforming and stacking samples into a batch on the target device.

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::rng::derived_rng;
use crate::{DataError, ImageBatch, ImageItem, ImageSource, Transform};

/// Everything a worker needs to build any batch; shared by all workers.
pub(crate) struct BatchRecipe {
    pub source: Box<dyn ImageSource>,
    pub transforms: Vec<Transform>,
    pub device: Device,
    pub seed: u64,
}

impl BatchRecipe {
    fn item(&self, epoch: u64, index: usize) -> Result<ImageItem, DataError> {
        let produce = || {
            let mut item = self.source.get(index)?;
            let mut rng = derived_rng(self.seed, epoch.wrapping_add(1), index as u64);
            for transform in &self.transforms {
                transform.apply(&mut item, &mut rng);
            }
            Ok(item)
        };
        catch_unwind(AssertUnwindSafe(produce)).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Err(DataError::WorkerPanicked { index, message })
        })
    }

    /// Builds the batch of samples `indices` for `epoch`.
    pub fn build(&self, epoch: u64, indices: Vec<usize>) -> Result<ImageBatch, DataError> {
        let mut pixels = Vec::new();
        let mut labels = Vec::with_capacity(indices.len());
        let mut shape = None;
        for &index in &indices {
            let item = self.item(epoch, index)?;
            match shape {
                None => {
                    pixels.reserve(item.pixels.len() * indices.len());
                    shape = Some(item.shape);
                }
                Some(expected) if expected != item.shape => {
                    return Err(DataError::Item {
                        index,
                        detail: format!(
                            "shape {:?} differs from the batch's {expected:?}",
                            item.shape
                        ),
                    });
                }
                Some(_) => {}
            }
            if item.pixels.len() != item.shape.iter().product::<usize>() {
                return Err(DataError::Item {
                    index,
                    detail: format!("{} values for shape {:?}", item.pixels.len(), item.shape),
                });
            }
            pixels.extend_from_slice(&item.pixels);
            labels.push(item.label as i64);
        }
        let [c, h, w] = shape.unwrap_or([0, 0, 0]);
        let images = Tensor::from_data(
            TensorData::new(pixels, [indices.len(), c, h, w]),
            &self.device,
        );
        let labels =
            Tensor::<1, Int>::from_data(TensorData::new(labels, [indices.len()]), &self.device);
        Ok(ImageBatch {
            images,
            labels,
            indices,
        })
    }
}
