//! kiln's im2col convolution equals Burn's, forward and both backward halves: to 1e-4 of the
//! largest value (measured below 1e-5 here; the GEMM and Flex's convolution sum in different
//! orders, which differ again on other CPUs' kernels).

use burn::nn::PaddingConfig2d;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::tensor::{Device, Distribution, Tensor};

use crate::conv::conv2d;
use crate::init_module;

/// Largest |a − b| over the largest |b|.
fn relative_error(a: Tensor<4>, b: Tensor<4>) -> f32 {
    let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-12);
    (a - b).abs().max().into_scalar::<f32>() / scale
}

/// Input gradient, weight gradient and (if any) bias gradient of `sum(forward(x) * upstream)`.
fn forward_and_grads(
    conv: &Conv2d,
    x: &Tensor<4>,
    upstream: &Tensor<4>,
    kiln: bool,
) -> (Tensor<4>, Tensor<4>, Tensor<4>, Option<Tensor<1>>) {
    let x = x.clone().detach().require_grad();
    let out = if kiln {
        conv2d(conv, x.clone())
    } else {
        conv.forward(x.clone())
    };
    let grads = (out.clone() * upstream.clone()).sum().backward();
    let bias = conv
        .bias
        .as_ref()
        .map(|b| b.val().grad(&grads).expect("bias grad"));
    (
        out.detach(),
        x.grad(&grads).expect("input grad"),
        conv.weight.val().grad(&grads).expect("weight grad"),
        bias,
    )
}

#[test]
fn im2col_convolution_equals_burns_forward_and_backward() {
    let device = Device::flex().autodiff();
    // (in, out, kernel, stride, padding, bias, input size [h, w])
    let cases = [
        (
            3,
            8,
            [3, 3],
            [1, 1],
            PaddingConfig2d::Explicit(1, 1, 1, 1),
            false,
            [9, 9],
        ),
        (
            4,
            6,
            [3, 3],
            [2, 2],
            PaddingConfig2d::Explicit(1, 1, 1, 1),
            true,
            [10, 7],
        ),
        (5, 4, [1, 1], [2, 2], PaddingConfig2d::Valid, false, [9, 8]),
        (2, 3, [1, 1], [1, 1], PaddingConfig2d::Valid, true, [5, 5]),
        (
            3,
            5,
            [7, 7],
            [2, 2],
            PaddingConfig2d::Explicit(3, 3, 3, 3),
            false,
            [16, 16],
        ),
        (
            2,
            4,
            [3, 2],
            [1, 2],
            PaddingConfig2d::Explicit(2, 0, 1, 1),
            true,
            [6, 7],
        ),
    ];
    for (index, (cin, cout, kernel, stride, padding, bias, [h, w])) in cases.into_iter().enumerate()
    {
        let conv = init_module(&device, index as u64, || {
            Conv2dConfig::new([cin, cout], kernel)
                .with_stride(stride)
                .with_padding(padding.clone())
                .with_bias(bias)
                .init(&device)
        });
        let x = Tensor::<4>::random([3, cin, h, w], Distribution::Normal(0.0, 1.0), &device);
        let want = forward_and_grads(&conv, &x, &conv.forward(x.clone()).detach(), false);
        let upstream = want.0.clone().random_like(Distribution::Normal(0.0, 1.0));
        let want = forward_and_grads(&conv, &x, &upstream, false);
        let got = forward_and_grads(&conv, &x, &upstream, true);
        assert_eq!(got.0.dims(), want.0.dims(), "case {index}: output shape");
        for (what, got, want) in [
            ("output", got.0, want.0),
            ("input gradient", got.1, want.1),
            ("weight gradient", got.2, want.2),
        ] {
            let error = relative_error(got, want);
            assert!(error <= 1e-4, "case {index}: {what} differs by {error}");
        }
        if let (Some(got), Some(want)) = (got.3, want.3) {
            let error = relative_error(got.reshape([1, 1, 1, cout]), want.reshape([1, 1, 1, cout]));
            assert!(
                error <= 1e-4,
                "case {index}: bias gradient differs by {error}"
            );
        }
    }
}

#[test]
fn a_wrong_convolution_fails_the_comparison() {
    // The control: a kernel flipped in space must exceed the tolerance by far.
    let device = Device::flex();
    let conv = init_module(&device, 3, || {
        Conv2dConfig::new([2, 3], [3, 3])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init(&device)
    });
    let x = Tensor::<4>::random([2, 2, 6, 6], Distribution::Normal(0.0, 1.0), &device);
    let flipped = crate::conv::im2col_conv2d(
        x.clone(),
        conv.weight.val().flip([2, 3]),
        conv.bias.as_ref().map(|b| b.val()),
        [1, 1],
        [(1, 1), (1, 1)],
    );
    assert!(relative_error(flipped, conv.forward(x)) > 1e-2);
}
