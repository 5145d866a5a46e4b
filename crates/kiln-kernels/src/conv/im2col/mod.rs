//! im2col and col2im: the convolution as one GEMM per block of images over copied columns.

pub(crate) mod columns;
pub(crate) mod strided;
