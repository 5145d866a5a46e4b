//! Element types that can be communicated.

use half::{bf16, f16};

/// A buffer element: `f32`, or a half type that is reduced in `f32`.
pub trait CommElement: Copy + Send + Sync + 'static {
    /// Widens to `f32`.
    fn to_f32(self) -> f32;
    /// Narrows from `f32` (round to nearest).
    fn from_f32(value: f32) -> Self;
}

impl CommElement for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(value: f32) -> Self {
        value
    }
}

impl CommElement for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f32(value: f32) -> Self {
        f16::from_f32(value)
    }
}

impl CommElement for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
}

/// Copies `src` into `dst`, converting element types (a plain copy for `f32`).
#[inline]
pub(crate) fn widen_into<T: CommElement>(dst: &mut Vec<f32>, src: &[T]) {
    dst.clear();
    dst.extend(src.iter().map(|v| v.to_f32()));
}

/// Copies `src` into `dst`, narrowing to `T`.
#[inline]
pub(crate) fn narrow_into<T: CommElement>(dst: &mut [T], src: &[f32]) {
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, s)| *d = T::from_f32(*s));
}
