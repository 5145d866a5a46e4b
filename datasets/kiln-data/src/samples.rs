//! What kiln's steps need of a batch, and of whatever yields batches.
//!
//! [`DataLoader`](crate::DataLoader) yields [`ImageBatch`]es, but a user's model may take
//! anything (token ids, tabular rows, pairs of tensors). The trainer, the data-parallel step
//! and the pipeline only ever need to count a batch's samples and cut it into micro-batches
//! by sample ranges ([`Batch`]), and to ask a source for an epoch of batches, possibly from
//! a later batch on ([`BatchSource`]).
//! Why a source trait and not a generic loader: see [`BatchSource`].

use std::ops::Range;

use burn::tensor::Device;

use crate::{DataError, ImageBatch};

/// A batch of samples, on its device, as a training step consumes it.
///
/// The pipeline cuts a batch into micro-batches by sample ranges, the data-parallel step
/// weights each micro-batch's gradient by its sample count. Cutting must be along the
/// samples of every tensor the batch holds (inputs and targets alike), so that
/// `batch.slice(a..b)` holds samples `a..b`.
///
/// ```
/// use burn::tensor::{Device, Tensor};
/// use kiln_data::Batch;
///
/// #[derive(Debug, Clone)]
/// struct Pairs {
///     x: Tensor<2>,
///     y: Tensor<2>,
/// }
///
/// impl Batch for Pairs {
///     fn samples(&self) -> usize {
///         self.x.dims()[0]
///     }
///     fn slice(&self, range: std::ops::Range<usize>) -> Self {
///         Pairs { x: self.x.clone().slice([range.clone()]), y: self.y.clone().slice([range]) }
///     }
/// }
///
/// let device = Device::flex();
/// let batch = Pairs { x: Tensor::zeros([5, 3], &device), y: Tensor::zeros([5, 1], &device) };
/// assert_eq!(batch.slice(1..4).samples(), 3);
/// ```
pub trait Batch: Clone + Send + 'static {
    /// Samples in the batch (the first dimension of its tensors).
    fn samples(&self) -> usize;

    /// Samples `range` of the batch (`range.end <= self.samples()`), in order.
    fn slice(&self, range: Range<usize>) -> Self;

    /// The batch on `device`'s compute resource, each tensor tracked by autodiff exactly
    /// when it was (as [`Tensor::to_device`](burn::tensor::Tensor::to_device)): a pipeline
    /// whose stages sit on different devices moves the first stage's inputs and the last
    /// stage's targets to them. `None` (the default) when the type cannot move; such a
    /// pipeline then stops at its first step with an error that says so.
    fn to_device(&self, device: &Device) -> Option<Self> {
        let _ = device;
        None
    }
}

impl Batch for ImageBatch {
    fn samples(&self) -> usize {
        self.indices.len()
    }

    fn slice(&self, range: Range<usize>) -> Self {
        ImageBatch {
            images: self.images.clone().slice([range.clone()]),
            labels: self.labels.clone().slice([range.clone()]),
            indices: self.indices[range].to_vec(),
        }
    }

    fn to_device(&self, device: &Device) -> Option<Self> {
        Some(ImageBatch {
            images: self.images.clone().to_device(device),
            labels: self.labels.clone().to_device(device),
            indices: self.indices.clone(),
        })
    }
}

/// `batch` cut into `count` micro-batches of consecutive samples (sizes differ by at most
/// one, larger first).
///
/// # Errors
/// [`DataError::Cut`] when the batch has fewer samples than `count` (or `count` is 0).
pub fn cut_batch<B: Batch>(batch: &B, count: usize) -> Result<Vec<B>, DataError> {
    let size = batch.samples();
    if count == 0 || size < count {
        return Err(DataError::Cut {
            samples: size,
            count,
        });
    }
    let mut start = 0;
    Ok((0..count)
        .map(|m| {
            let len = size / count + usize::from(m < size % count);
            let range = start..start + len;
            start += len;
            batch.slice(range)
        })
        .collect())
}

/// The batches of one epoch, in order, as a [`BatchSource`] gives them.
pub type Batches<'a, B> = Box<dyn Iterator<Item = Result<B, DataError>> + 'a>;

/// Yields a training run's batches epoch after epoch: what the trainer and the pipeline
/// read their data from.
///
/// An epoch must give [`num_batches`](Self::num_batches) batches, the same ones whenever it
/// is asked for (a resumed run asks for an epoch from a later batch on and must see the
/// batches it would have seen). [`DataLoader`](crate::DataLoader) is one (reshuffled per
/// epoch by its seed); [`BatchList`] gives the same built batches every epoch; a user's own
/// loader of any [`Batch`] type is a third.
///
/// **Why a source trait, not a generic loader.** The loader's workers, sampler and
/// augmentation are built around labelled images ([`ImageSource`](crate::ImageSource),
/// [`Transform`](crate::Transform)); making it generic over what it collates would change
/// every part of it for no gain to image users, and would still not cover data that arrives
/// already batched (a user's own pipeline, a file of tensors). The trainer and the pipeline
/// need only what this trait asks (the batches per epoch, an epoch from a given batch on,
/// where batches are built, for a check), so they take any source: the least they can ask,
/// and nothing the loader does is lost.
pub trait BatchSource {
    /// What it yields.
    type Batch: Batch;

    /// Batches per epoch.
    fn num_batches(&self) -> usize;

    /// The batches of `epoch` from batch `first` on (the same ones the whole epoch gives
    /// from its `first`-th on).
    fn batches(&mut self, epoch: u64, first: usize) -> Batches<'_, Self::Batch>;

    /// The device batches are built on, when the source knows it (the trainer checks that
    /// training batches carry autodiff and validation batches do not).
    fn device(&self) -> Option<&Device> {
        None
    }
}

impl BatchSource for crate::DataLoader {
    type Batch = ImageBatch;

    fn num_batches(&self) -> usize {
        crate::DataLoader::num_batches(self)
    }

    fn batches(&mut self, epoch: u64, first: usize) -> Batches<'_, ImageBatch> {
        Box::new(self.epoch_from(epoch, first))
    }

    fn device(&self) -> Option<&Device> {
        Some(crate::DataLoader::device(self))
    }
}

/// Batches already built, the same ones every epoch: a [`BatchSource`] for data that fits
/// in memory, for tests, or for batches a user's own code prepared.
#[derive(Debug, Clone)]
pub struct BatchList<B> {
    batches: Vec<B>,
    device: Option<Device>,
}

impl<B: Batch> BatchList<B> {
    /// A source that gives `batches`, in order, every epoch.
    pub fn new(batches: Vec<B>) -> Self {
        Self {
            batches,
            device: None,
        }
    }

    /// Says which device the batches are on (so the trainer can check it).
    pub fn on_device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }
}

impl<B: Batch> BatchSource for BatchList<B> {
    type Batch = B;

    fn num_batches(&self) -> usize {
        self.batches.len()
    }

    fn batches(&mut self, _epoch: u64, first: usize) -> Batches<'_, B> {
        Box::new(self.batches.iter().skip(first).cloned().map(Ok))
    }

    fn device(&self) -> Option<&Device> {
        self.device.as_ref()
    }
}

impl<S: BatchSource + ?Sized> BatchSource for &mut S {
    type Batch = S::Batch;

    fn num_batches(&self) -> usize {
        (**self).num_batches()
    }

    fn batches(&mut self, epoch: u64, first: usize) -> Batches<'_, S::Batch> {
        (**self).batches(epoch, first)
    }

    fn device(&self) -> Option<&Device> {
        (**self).device()
    }
}
