//! What the kernels' tests share: convolution sizes, reproducible inputs, the relative error
//! they are held to, and runs in pools of a given size.

use crate::conv::dims::ConvDims;
use crate::conv::geometry::ConvGeometry;

/// The sizes of a convolution of `channels` channels, `input` and `kernel` under `g`.
///
/// # Panics
///
/// If the padded input is smaller than the kernel.
pub(crate) fn conv_dims(
    channels: usize,
    input: [usize; 2],
    kernel: [usize; 2],
    g: ConvGeometry,
) -> ConvDims {
    ConvDims {
        channels,
        input,
        kernel,
        output: g.output_size(input, kernel).expect("valid shape"),
        geometry: g,
    }
}

pub(crate) use crate::parts::values;
pub(crate) use kiln_test_support::relative_error;

/// [`relative_error`] of two tensors' values.
pub(crate) fn tensor_relative_error<const D: usize>(
    a: burn::tensor::Tensor<D>,
    b: burn::tensor::Tensor<D>,
) -> f32 {
    let values =
        |t: burn::tensor::Tensor<D>| t.into_data().try_to_vec::<f32>().expect("f32 values");
    relative_error(&values(a), &values(b))
}

/// `work` run in a rayon pool of `threads` threads.
pub(crate) fn in_pool<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
        .install(work)
}
