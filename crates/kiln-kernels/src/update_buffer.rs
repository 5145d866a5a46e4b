//! The buffer an optimizer's one-pass update writes a tensor's new values into: the tensor's
//! own storage when nothing else holds it, else a copy (the shared tensor keeps its values).

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, FlexDevice, TensorMetadata};
use burn::tensor::{Shape, TensorData};

use crate::activation::flex::{readable, writable};
use crate::zeroed::zeroed;

type FlexTensor = FloatTensor<Flex>;

/// Where an update goes: in place, or into values of its own (a copy, or a fresh state).
pub(crate) enum UpdateBuffer {
    InPlace(FlexTensor),
    Own(Vec<f32>, Shape),
}

impl UpdateBuffer {
    /// `tensor`'s storage when it can be overwritten, else a copy of its values (read as
    /// f32, contiguous; the shared tensor is let go).
    pub(crate) fn new(tensor: FlexTensor) -> Self {
        match writable(readable(tensor)) {
            Ok(tensor) => UpdateBuffer::InPlace(tensor),
            Err(shared) => {
                let values = shared.as_slice::<f32>().expect("contiguous f32").to_vec();
                UpdateBuffer::Own(values, shared.shape())
            }
        }
    }

    /// A new state of `shape`, zeroed (an optimizer's first step writes all of it).
    pub(crate) fn zeros(shape: Shape) -> Self {
        UpdateBuffer::Own(zeroed(shape.num_elements()), shape)
    }

    pub(crate) fn values(&mut self) -> &mut [f32] {
        match self {
            UpdateBuffer::InPlace(tensor) => tensor.storage_mut::<f32>(),
            UpdateBuffer::Own(values, _) => values,
        }
    }

    pub(crate) fn finish(self) -> FlexTensor {
        match self {
            UpdateBuffer::InPlace(tensor) => tensor,
            UpdateBuffer::Own(values, shape) => {
                Flex::float_from_data(TensorData::new(values, shape), &FlexDevice)
            }
        }
    }
}
