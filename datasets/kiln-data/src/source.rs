//! Random access to labelled images.

use std::sync::Arc;

use burn::data::dataset::Dataset;

use crate::{DataError, ImageItem};

/// A data set the loader can read from any worker thread.
///
/// Unlike Burn's `Dataset::get`, which returns `Option`, a failing item is an error that
/// names what went wrong, so the loader can hand it to the training loop.
pub trait ImageSource: Send + Sync + 'static {
    /// Number of samples.
    fn len(&self) -> usize;
    /// Sample `index`.
    fn get(&self, index: usize) -> Result<ImageItem, DataError>;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<S: ImageSource + ?Sized> ImageSource for Arc<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        (**self).get(index)
    }
}

impl<S: ImageSource + ?Sized> ImageSource for Box<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        (**self).get(index)
    }
}

/// Adapts any Burn [`Dataset`] of [`ImageItem`]s; a failing item becomes [`DataError::Item`].
#[derive(Debug, Clone)]
pub struct BurnDataset<D>(pub D);

impl<D> ImageSource for BurnDataset<D>
where
    D: Dataset<ImageItem> + 'static,
{
    fn len(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        self.0.get(index).map_err(|err| DataError::Item {
            index,
            detail: err.to_string(),
        })
    }
}
