//! 2-D convolution as one matrix product over an im2col matrix, built from Burn tensor ops.
//!
//! Burn's CPU backend (Flex) runs a convolution's forward at 20–50 % of what its own GEMM
//! reaches on the same number of multiply-adds, and its two backward halves (a transposed
//! convolution for the input gradient, a dilated convolution for the weight gradient) lower
//! still; 1×1 strided convolutions run at 1–4 GFLOP/s where the same GEMM reaches 12–22
//! (`cargo xtask bench --only profile`). Written as `weight [Cout, Cin·k·k] × columns
//! [Cin·k·k, N·Ho·Wo]`, the forward is one GEMM, and autodiff differentiates it into two
//! more GEMMs (the weight gradient and the columns' gradient) plus the columns' scatter back.
//!
//! Which path is faster depends on the kernel (measured on ResNet-18's shapes, forward and
//! backward, `--only profile`): for 1×1 kernels there are no columns to build and the GEMM
//! path takes 0.35–0.48× Burn's time; for k×k kernels the k² strided slices and their
//! scatter in backward cost more than the GEMM saves (1.0–1.9× Burn's time). [`conv2d`] so
//! takes the GEMM path for 1×1 kernels (without groups or dilation, with explicit or no
//! padding) and Burn's own convolution otherwise — a fixed rule rather than a timing, so that
//! every run and every replica computes the same arithmetic. [`im2col_conv2d`] is the GEMM
//! path for any kernel.

use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2d;
use burn::tensor::{Slice, Tensor};

/// `conv.forward(x)` on the faster path for its shape (see the module docs); equal to Burn's
/// convolution within float rounding. Call it where a model would call `conv.forward(x)`.
pub fn conv2d(conv: &Conv2d, x: Tensor<4>) -> Tensor<4> {
    if conv.kernel_size != [1, 1] {
        return conv.forward(x);
    }
    let padding = match conv.padding {
        PaddingConfig2d::Valid => [(0, 0), (0, 0)],
        PaddingConfig2d::Explicit(top, left, bottom, right) => [(top, bottom), (left, right)],
        PaddingConfig2d::Same => return conv.forward(x),
    };
    if conv.groups != 1 || conv.dilation != [1, 1] {
        return conv.forward(x);
    }
    im2col_conv2d(
        x,
        conv.weight.val(),
        conv.bias.as_ref().map(|b| b.val()),
        conv.stride,
        padding,
    )
}

/// Convolution of `x` `[N, Cin, H, W]` with `weight` `[Cout, Cin, kh, kw]` (no groups, no
/// dilation), `padding` as (before, after) per spatial dimension, through one GEMM.
///
/// # Panics
///
/// If the channels of `x` and `weight` differ, or the padded input is smaller than the kernel.
pub fn im2col_conv2d(
    x: Tensor<4>,
    weight: Tensor<4>,
    bias: Option<Tensor<1>>,
    stride: [usize; 2],
    padding: [(usize, usize); 2],
) -> Tensor<4> {
    let [batch, channels, height, width] = x.dims();
    let [out_channels, in_channels, kh, kw] = weight.dims();
    assert_eq!(channels, in_channels, "input and weight channels differ");
    let padded = [
        height + padding[0].0 + padding[0].1,
        width + padding[1].0 + padding[1].1,
    ];
    assert!(
        padded[0] >= kh && padded[1] >= kw,
        "the padded input is smaller than the kernel"
    );
    let out = [
        (padded[0] - kh) / stride[0] + 1,
        (padded[1] - kw) / stride[1] + 1,
    ];
    // Channels first, so that the columns come out as [Cin, k·k, N, Ho, Wo] without a
    // transpose of the (k·k times larger) column matrix.
    let x = x.swap_dims(0, 1);
    let x = if padding == [(0, 0), (0, 0)] {
        x
    } else {
        x.pad(
            [(0, 0), (0, 0), padding[0], padding[1]],
            burn::tensor::ops::PadMode::Constant(0.0),
        )
    };
    let window = |offset: usize, dim: usize| {
        let end = offset + stride[dim] * (out[dim] - 1) + 1;
        Slice::new(offset as isize, Some(end as isize), stride[dim] as isize)
    };
    let columns = if kh == 1 && kw == 1 {
        x.slice([Slice::full(), Slice::full(), window(0, 0), window(0, 1)])
            .reshape([in_channels, batch * out[0] * out[1]])
    } else {
        let taps: Vec<Tensor<4>> = (0..kh)
            .flat_map(|i| (0..kw).map(move |j| (i, j)))
            .map(|(i, j)| {
                x.clone()
                    .slice([Slice::full(), Slice::full(), window(i, 0), window(j, 1)])
            })
            .collect();
        Tensor::stack::<5>(taps, 1).reshape([in_channels * kh * kw, batch * out[0] * out[1]])
    };
    let product = weight
        .reshape([out_channels, in_channels * kh * kw])
        .matmul(columns);
    let product = match bias {
        Some(bias) => product + bias.reshape([out_channels, 1]),
        None => product,
    };
    product
        .reshape([out_channels, batch, out[0], out[1]])
        .swap_dims(0, 1)
}
