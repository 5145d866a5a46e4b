//! An image-classification task: its training and validation images and the transforms each
//! takes, ready to make loaders from.

use std::path::Path;
use std::sync::Arc;

use crate::{
    Cifar10, DataError, DataLoader, DataLoaderBuilder, ImageSource, SyntheticImages, Transform,
};

/// Training and validation images with their transforms: the data of a classification run,
/// shared by every replica and stage (the sources are `Arc`s).
///
/// ```
/// use kiln_data::ImageTask;
///
/// let task = ImageTask::synthetic_cifar(256, 10, 7);
/// let mut loader = task.train_loader().batch_size(64).shuffle(7).build();
/// assert_eq!(loader.num_batches(), 4);
/// assert_eq!(task.valid.len(), 1_000);
/// # let _ = loader.epoch(0);
/// ```
#[derive(Clone)]
pub struct ImageTask {
    /// The training images.
    pub train: Arc<dyn ImageSource>,
    /// The validation images.
    pub valid: Arc<dyn ImageSource>,
    /// What each training image goes through (augmentation, then normalisation).
    pub train_transforms: Vec<Transform>,
    /// What each validation image goes through (the normalisation, without augmentation).
    pub valid_transforms: Vec<Transform>,
}

impl ImageTask {
    /// CIFAR-10 from its binary directory (`cifar-10-batches-bin`): its 50,000 training
    /// images padded-cropped, flipped and normalised, its 10,000 test images normalised.
    ///
    /// # Errors
    /// [`DataError`] when a file is missing or malformed.
    pub fn cifar10(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let dir = dir.as_ref();
        let mut train_transforms = Transform::cifar_augmentation();
        train_transforms.push(Transform::cifar_normalize());
        Ok(Self {
            train: Arc::new(Cifar10::train(dir)?),
            valid: Arc::new(Cifar10::test(dir)?),
            train_transforms,
            valid_transforms: vec![Transform::cifar_normalize()],
        })
    }

    /// A synthetic CIFAR-shaped task ([`SyntheticImages::cifar_like`]): `samples` training
    /// images of `classes` classes and 1,000 validation images of the same distribution,
    /// untransformed.
    pub fn synthetic_cifar(samples: usize, classes: usize, seed: u64) -> Self {
        let train = SyntheticImages::cifar_like(samples, classes, seed);
        let valid = train.split(1_000, 1);
        Self {
            train: Arc::new(train),
            valid: Arc::new(valid),
            train_transforms: Vec::new(),
            valid_transforms: Vec::new(),
        }
    }

    /// A loader over the training images with their transforms (batch, shuffling, sharding
    /// and device still to set).
    pub fn train_loader(&self) -> DataLoaderBuilder {
        DataLoader::builder(Arc::clone(&self.train)).transforms(self.train_transforms.clone())
    }

    /// A loader over the validation images with their transforms, in order.
    pub fn valid_loader(&self) -> DataLoaderBuilder {
        DataLoader::builder(Arc::clone(&self.valid)).transforms(self.valid_transforms.clone())
    }
}
