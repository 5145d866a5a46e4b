//! Casting a model's inputs and outputs, whatever their type, for mixed precision.

use burn::tensor::{Bool, FloatDType, Int, Tensor};

/// A value whose float tensors mixed precision can cast: a model's input (cast to the
/// working precision) and its output (widened to f32 before the loss).
///
/// Implemented for float tensors (cast), int and bool tensors (unchanged: token ids and
/// masks keep their type), and tuples, `Vec`s, `Option`s and `Box`es of such values.
/// Implement it for a struct of tensors by casting each float field:
///
/// ```
/// use burn::tensor::{Device, FloatDType, Int, Tensor};
/// use kiln_amp::FloatCast;
///
/// struct Inputs {
///     features: Tensor<2>,
///     ids: Tensor<1, Int>,
/// }
///
/// impl FloatCast for Inputs {
///     fn cast_float(self, dtype: FloatDType) -> Self {
///         Inputs { features: self.features.cast_float(dtype), ids: self.ids }
///     }
/// }
///
/// let device = Device::flex();
/// let inputs = Inputs { features: Tensor::zeros([2, 3], &device), ids: Tensor::zeros([2], &device) };
/// let half = inputs.cast_float(FloatDType::BF16);
/// assert_eq!(half.features.dtype(), burn::tensor::DType::BF16);
/// ```
pub trait FloatCast {
    /// The value with its float tensors in `dtype`.
    fn cast_float(self, dtype: FloatDType) -> Self;
}

impl<const D: usize> FloatCast for Tensor<D> {
    fn cast_float(self, dtype: FloatDType) -> Self {
        self.cast(dtype)
    }
}

impl<const D: usize> FloatCast for Tensor<D, Int> {
    fn cast_float(self, _dtype: FloatDType) -> Self {
        self
    }
}

impl<const D: usize> FloatCast for Tensor<D, Bool> {
    fn cast_float(self, _dtype: FloatDType) -> Self {
        self
    }
}

impl<T: FloatCast> FloatCast for Vec<T> {
    fn cast_float(self, dtype: FloatDType) -> Self {
        self.into_iter()
            .map(|value| value.cast_float(dtype))
            .collect()
    }
}

impl<T: FloatCast> FloatCast for Option<T> {
    fn cast_float(self, dtype: FloatDType) -> Self {
        self.map(|value| value.cast_float(dtype))
    }
}

impl<T: FloatCast> FloatCast for Box<T> {
    fn cast_float(self, dtype: FloatDType) -> Self {
        Box::new((*self).cast_float(dtype))
    }
}

impl<A: FloatCast, B: FloatCast> FloatCast for (A, B) {
    fn cast_float(self, dtype: FloatDType) -> Self {
        (self.0.cast_float(dtype), self.1.cast_float(dtype))
    }
}

impl<A: FloatCast, B: FloatCast, C: FloatCast> FloatCast for (A, B, C) {
    fn cast_float(self, dtype: FloatDType) -> Self {
        (
            self.0.cast_float(dtype),
            self.1.cast_float(dtype),
            self.2.cast_float(dtype),
        )
    }
}
