//! kiln's own compute kernels for Burn's CPU backend (Flex).
//!
//! Burn 0.22 lets a crate register an operation with its runtime dispatch (a *backend
//! extension*) and give it a handwritten backward pass under autodiff. kiln uses that for the
//! operations that dominate a convolutional network's training step on the CPU:
//!
//! - [`conv2d`] / [`conv2d_with`] — a 2-D convolution by the path measured fastest for its
//!   shape: for 3×3 unit-stride kernels with at least 32 channels each side, Winograd's
//!   F(4×4, 3×3) forward (36 GEMMs per block over transformed tiles: 4× fewer multiply-adds)
//!   at outputs of 32×32 and more (16×16 from 64 channels); for other unit-stride shapes of
//!   large images (≥ 8 input channels, ≥ 256 output positions), `kh` GEMMs over `kw`
//!   column-shifted copies of the padded image; F(2×2, 3×3) (16 GEMMs, 2.25× fewer) for the
//!   3×3 outputs from 8×8 those leave and for wide layers' weight gradients; on CPUs with
//!   AVX-512 or AVX2 (capped by [`MAX_ISA_VARIABLE`]), direct convolutions (register tiles summed over the zero-padded input in place)
//!   for the other forwards of up to 128 channels at 3×3, strides 1 and 2, and for the weight
//!   gradients of up to 64 × 64 channels and of strided and 1×1 layers; im2col + one GEMM per
//!   block of images for the rest. Its input gradient is a convolution of the output gradient with the
//!   flipped kernel (unit strides, so it takes the same paths) or a GEMM and a col2im, its
//!   weight gradient one more GEMM per block (16 under Winograd),
//!   instead of Flex's tiled forward, transposed convolution and dilated convolution. The
//!   path is chosen from the shape alone (thresholds measured once, in the source), never by
//!   timing at run time, so a run's arithmetic is reproducible.
//!   Equal to Burn's convolution within float rounding, forward and backward. f16/bf16 inputs
//!   compute in f32; other backends, f64 and grouped convolutions run Burn's own.
//! - [`batch_norm_train`] — training-mode batch norm straight on the NCHW layout: statistics
//!   in one pass per channel, output in one pass, backward in two, instead of Burn's generic
//!   composition (which copies the activation to channels-first several times per layer).
//! - [`batch_norm_inference`] — inference-mode batch norm (running statistics) in one pass
//!   split over the pool, where Burn's composition makes four single-threaded ones.
//! - [`relu`] / [`add_relu`] — ReLU, and a residual block's `relu(a + b)` in one pass, split
//!   over the replica's threads and in place when the input is not shared (Flex runs its
//!   element-wise operations on one thread); Burn's bit for bit, output and gradients.
//! - [`sgd_step`] — SGD's update (weight decay, momentum, Nesterov) in one pass over a
//!   parameter, its gradient and its velocity, split over the replica's threads, instead of
//!   Burn's `Sgd`'s up to seven single-threaded passes; Burn's bit for bit. The
//!   [`FusedSgd`] optimizer (`sgd/`) runs it: Burn's `Sgd` with the same configuration.
//! - [`FusedAdamW`] — AdamW (decoupled or cautious weight decay, AMSGrad) in one pass over a
//!   parameter, its gradient and its moments, split over the replica's threads, instead of
//!   Burn's `AdamW`'s fourteen or so single-threaded passes; Burn's bit for bit, and its
//!   state is Burn's (`adamw/`).
//!
//! Results do not depend on the thread count: work is split into pieces that never write the
//! same element, and every sum runs in an order fixed by the shapes.
#![warn(missing_docs)]

mod activation;
mod adamw;
mod attention;
mod backward;
mod batch_norm;
mod conv;
mod gemm;
mod isa;
mod lane_sums;
mod layer_norm;
mod parts;
mod scratch;
mod sgd;
mod short_copy;
mod simd;
#[cfg(test)]
mod test_support;
mod update_buffer;
mod zeroed;

pub use activation::entry::{add_relu, gelu, relu};
pub use activation::extension::ActivationKernel;
pub use adamw::{AdamWCoefficients, AdamWDecay, AdamWKernel, FusedAdamW, FusedAdamWConfig};
pub use attention::{AttentionKernel, causal_attention};
pub use batch_norm::entry::{NormalizedBatch, batch_norm_inference, batch_norm_train};
pub use batch_norm::extension::BatchNormKernel;
pub use conv::entry::{conv2d, conv2d_with, uses_kiln_kernel};
pub use conv::extension::ConvKernel;
pub use conv::geometry::ConvGeometry;
pub use conv::path::{ConvPass, ConvPath, conv_path};
pub use conv::probe::ConvProbe;
pub use isa::MAX_ISA_VARIABLE;
pub use layer_norm::{LayerNormKernel, layer_norm};
pub use parts::{ConvBlock, KernelPart, PreparedPart};
pub use sgd::{
    FusedSgd, FusedSgdConfig, FusedSgdState, MomentumCoefficients, SgdCoefficients, SgdKernel,
    sgd_step,
};
