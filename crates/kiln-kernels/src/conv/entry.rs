//! The entry points: a 2-D convolution that takes kiln's kernel where it applies and Burn's
//! own convolution everywhere else.

use burn::backend::DispatchDevice;
use burn::module::Param;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2d;
use burn::tensor::{DType, Tensor};

use crate::conv::extension::ConvKernel;
use crate::conv::geometry::ConvGeometry;

/// `conv.forward(x)`, computed by kiln's im2col + GEMM kernel where it applies (see
/// [`conv2d_with`]) and by Burn's convolution otherwise. Call it where a model would call
/// `conv.forward(x)`; the result and its gradients equal Burn's within float rounding.
///
/// ```
/// use burn::nn::conv::Conv2dConfig;
/// use burn::nn::PaddingConfig2d;
/// use burn::tensor::{Device, Distribution, Tensor};
///
/// let device = Device::flex().autodiff();
/// let conv = Conv2dConfig::new([3, 8], [3, 3])
///     .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
///     .init(&device);
/// let x = Tensor::<4>::random([2, 3, 8, 8], Distribution::Default, &device).require_grad();
/// let y = kiln_kernels::conv2d(&conv, x.clone());
/// assert_eq!(y.dims(), [2, 8, 8, 8]);
/// let grads = y.sum().backward();
/// assert!(x.grad(&grads).is_some());
/// ```
pub fn conv2d(conv: &Conv2d, x: Tensor<4>) -> Tensor<4> {
    let padding = match conv.padding {
        PaddingConfig2d::Valid => [(0, 0), (0, 0)],
        PaddingConfig2d::Explicit(top, left, bottom, right) => [(top, bottom), (left, right)],
        // Burn resolves "same" padding privately; its own convolution keeps that rule.
        PaddingConfig2d::Same => return conv.forward(x),
    };
    if conv.groups != 1 {
        return conv.forward(x);
    }
    let geometry = ConvGeometry::new()
        .with_stride(conv.stride)
        .with_padding(padding)
        .with_dilation(conv.dilation);
    conv2d_with(
        x,
        conv.weight.val(),
        conv.bias.as_ref().map(Param::val),
        geometry,
    )
}

/// Whether kiln's kernel runs a convolution of `x`: on Burn's CPU backend (Flex, with or
/// without autodiff) for f32, f16 and bf16 inputs. Half-precision inputs are computed in f32 and the
/// results cast back (Flex computes half-precision convolutions through f32 or slower f16
/// kernels anyway). Other backends and grouped convolutions take Burn's convolution (the GPU
/// backends have their own tuned kernels).
pub fn uses_kiln_kernel(x: &Tensor<4>) -> bool {
    on_flex(x) && kernel_dtype(x.dtype())
}

/// The dtypes kiln's kernels take: f32, and the half types they compute in f32 (f64 keeps
/// Burn's f64 arithmetic).
pub(crate) fn kernel_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether `x` lives on Burn's CPU backend, with or without autodiff.
pub(crate) fn on_flex<const D: usize>(x: &Tensor<D>) -> bool {
    matches!(x.device().inner().as_dispatch(), DispatchDevice::Flex(_))
}

/// Convolution of `x` `[N, Cin, H, W]` with `weight` `[Cout, Cin, kh, kw]` (no groups) and an
/// optional `bias` `[Cout]`, with kiln's kernel where [`uses_kiln_kernel`] says so and Burn's
/// `conv2d` otherwise.
///
/// # Panics
///
/// If the channels of `x` and `weight` differ, or the padded input is smaller than the
/// dilated kernel (as Burn's convolution does).
pub fn conv2d_with(
    x: Tensor<4>,
    weight: Tensor<4>,
    bias: Option<Tensor<1>>,
    geometry: ConvGeometry,
) -> Tensor<4> {
    let [_, channels, height, width] = x.dims();
    let [out_channels, in_channels, kh, kw] = weight.dims();
    assert_eq!(
        channels, in_channels,
        "conv2d: the input has {channels} channels, the weight expects {in_channels}"
    );
    assert!(
        geometry.output_size([height, width], [kh, kw]).is_some(),
        "conv2d: a {height}x{width} input with {geometry:?} is smaller than the {kh}x{kw} kernel"
    );
    let empty = x.shape().num_elements() == 0 || weight.shape().num_elements() == 0;
    if !uses_kiln_kernel(&x) || weight.dtype() != x.dtype() || empty {
        let options = burn::tensor::ops::ConvOptions::new_with_padding(
            geometry.stride,
            geometry.padding,
            geometry.dilation,
            1,
        );
        return burn::tensor::module::conv2d(x, weight, bias, options);
    }
    let output = Tensor::<4>::from_dispatch(<burn::backend::Dispatch as ConvKernel>::kiln_conv2d(
        x.into_dispatch(),
        weight.into_dispatch(),
        geometry,
    ));
    match bias {
        Some(bias) => output + bias.reshape([1, out_channels, 1, 1]),
        None => output,
    }
}
