//! kiln's convolution equals Burn's, forward and every gradient, to 1e-4 of the largest value
//! (im2col, shifted-GEMM and Winograd shapes alike; the GEMM and Flex's convolution sum in different orders, which differ again on other
//! CPUs' kernels; measured below 1e-5 here), and its results do not depend on threads.

use burn::module::Module;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::tensor::{DType, Device, Distribution, Tensor};
use kiln_core::init_module;

use crate::test_support::tensor_relative_error as relative_error;
use crate::{ConvGeometry, conv2d, conv2d_with, uses_kiln_kernel};

const TOLERANCE: f32 = 1e-4;

/// Output, input gradient, weight gradient and (if any) bias gradient of
/// `sum(forward(x) * upstream)`.
type Results = (Tensor<4>, Tensor<4>, Tensor<4>, Option<Tensor<1>>);

fn forward_and_grads(conv: &Conv2d, x: &Tensor<4>, upstream: &Tensor<4>, kiln: bool) -> Results {
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

/// (in, out, kernel, stride, padding, dilation, bias, batch, input size)
type Case = (
    usize,
    usize,
    [usize; 2],
    [usize; 2],
    PaddingConfig2d,
    [usize; 2],
    bool,
    usize,
    [usize; 2],
);

// One case a line: the table reads across.
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    use PaddingConfig2d::{Explicit, Valid};
    vec![
        (3, 8, [3, 3], [1, 1], Explicit(1, 1, 1, 1), [1, 1], false, 3, [9, 9]),
        (4, 6, [3, 3], [2, 2], Explicit(1, 1, 1, 1), [1, 1], true, 3, [10, 7]),
        (5, 4, [1, 1], [2, 2], Valid, [1, 1], false, 3, [9, 8]),
        (2, 3, [1, 1], [1, 1], Valid, [1, 1], true, 2, [5, 5]),
        (3, 5, [7, 7], [2, 2], Explicit(3, 3, 3, 3), [1, 1], false, 2, [16, 16]),
        (2, 4, [3, 2], [1, 2], Explicit(2, 0, 1, 1), [1, 1], true, 3, [6, 7]),
        (3, 4, [3, 3], [1, 1], Explicit(2, 2, 2, 2), [2, 2], false, 2, [8, 8]),
        // Unit stride, asymmetric padding: the input gradient as a flipped convolution.
        (3, 2, [3, 3], [1, 1], Explicit(0, 2, 1, 0), [1, 1], false, 2, [6, 5]),
        // Unit stride, padding beyond a 1x1 kernel's reach: the scattered input gradient.
        (2, 3, [1, 1], [1, 1], Explicit(1, 1, 1, 1), [1, 1], true, 2, [4, 4]),
        // One image per block (1 024 positions), ten blocks in eight weight-gradient groups.
        (6, 4, [3, 3], [1, 1], Explicit(1, 1, 1, 1), [1, 1], false, 10, [32, 32]),
        // A single image: one block, threads only inside the GEMM.
        (5, 7, [3, 3], [1, 1], Explicit(1, 1, 1, 1), [1, 1], true, 1, [20, 24]),
        // Shifted GEMMs (unit stride, >= 8 channels, >= 256 positions): forward and weight
        // gradient; the input gradient (6 channels) on im2col.
        (8, 6, [3, 3], [1, 1], Explicit(1, 1, 1, 1), [1, 1], true, 3, [16, 18]),
        // Shifted GEMMs with dilation and unequal padding, the input gradient shifted too.
        (10, 8, [3, 3], [1, 1], Explicit(1, 2, 1, 2), [1, 2], false, 2, [16, 20]),
        // Winograd F(2x2, 3x3): forward and weight gradient, and the input gradient as a
        // flipped convolution on the same path; an odd output width (a half-used tile).
        (64, 64, [3, 3], [1, 1], Explicit(1, 1, 1, 1), [1, 1], true, 2, [8, 9]),
        // Winograd with asymmetric padding (the input gradient's padding differs per side).
        (64, 72, [3, 3], [1, 1], Explicit(0, 2, 2, 1), [1, 1], false, 3, [9, 10]),
    ]
}

fn build(device: &Device, index: usize, case: &Case) -> Conv2d {
    let (cin, cout, kernel, stride, padding, dilation, bias, _, _) = case.clone();
    init_module(device, index as u64, || {
        Conv2dConfig::new([cin, cout], kernel)
            .with_stride(stride)
            .with_padding(padding)
            .with_dilation(dilation)
            .with_bias(bias)
            .init(device)
    })
}

#[test]
fn kiln_convolution_equals_burns_forward_and_backward() {
    let device = Device::flex().autodiff();
    for (index, case) in cases().iter().enumerate() {
        let conv = build(&device, index, case);
        let (cin, .., batch, [h, w]) = case.clone();
        let x = Tensor::<4>::random([batch, cin, h, w], Distribution::Normal(0.0, 1.0), &device);
        assert!(uses_kiln_kernel(&x));
        let shape = conv.forward(x.clone()).dims();
        let upstream = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let want = forward_and_grads(&conv, &x, &upstream, false);
        let got = forward_and_grads(&conv, &x, &upstream, true);
        assert_eq!(got.0.dims(), want.0.dims(), "case {index}: output shape");
        for (what, got, want) in [
            ("output", got.0, want.0),
            ("input gradient", got.1, want.1),
            ("weight gradient", got.2, want.2),
        ] {
            let error = relative_error(got, want);
            assert!(
                error <= TOLERANCE,
                "case {index}: {what} differs by {error}"
            );
        }
        if let (Some(got), Some(want)) = (got.3, want.3) {
            let error = relative_error(got, want);
            assert!(
                error <= TOLERANCE,
                "case {index}: bias gradient differs by {error}"
            );
        }
    }
}

#[test]
fn a_wrong_convolution_fails_the_comparison() {
    // The control: the same kernel flipped in space, or one image's input gradient dropped,
    // exceeds the tolerance by far.
    let device = Device::flex().autodiff();
    let case = cases()[0].clone();
    let conv = build(&device, 0, &case);
    let x = Tensor::<4>::random([3, 3, 9, 9], Distribution::Normal(0.0, 1.0), &device);
    let geometry = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
    let flipped = conv2d_with(x.clone(), conv.weight.val().flip([2, 3]), None, geometry);
    assert!(relative_error(flipped, conv.forward(x.clone())) > 1e-2);
    let upstream = conv.forward(x.clone()).detach().ones_like();
    let (_, got, ..) = forward_and_grads(&conv, &x, &upstream, true);
    let (_, want, ..) = forward_and_grads(&conv, &x, &upstream, false);
    let dropped = got.slice_assign(
        [0..1, 0..3, 0..9, 0..9],
        Tensor::zeros([1, 3, 9, 9], &device),
    );
    assert!(relative_error(dropped, want) > 1e-2);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let device = Device::flex().autodiff();
    // One block; ten blocks in eight groups; a single image.
    for index in [1, 9, 10] {
        let case = cases()[index].clone();
        let conv = build(&device, index, &case);
        let (cin, .., batch, [h, w]) = case;
        let x = Tensor::<4>::random([batch, cin, h, w], Distribution::Normal(0.0, 1.0), &device);
        let upstream = conv
            .forward(x.clone())
            .detach()
            .random_like(Distribution::Default);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| forward_and_grads(&conv, &x, &upstream, true))
        };
        let (one, three) = (run(1), run(3));
        for (a, b) in [(one.0, three.0), (one.1, three.1), (one.2, three.2)] {
            a.into_data().assert_eq(&b.into_data(), true);
        }
    }
}

#[test]
fn inference_and_half_precision_run_the_kernel() {
    let device = Device::flex();
    let case = cases()[0].clone();
    let conv = build(&device, 0, &case);
    let x = Tensor::<4>::random([2, 3, 9, 9], Distribution::Normal(0.0, 1.0), &device);
    // Without autodiff the kernel runs too.
    assert!(uses_kiln_kernel(&x));
    let error = relative_error(conv2d(&conv, x.clone()), conv.forward(x.clone()));
    assert!(error <= TOLERANCE, "inference output differs by {error}");
    // Half-precision inputs run it through f32 and come back in their dtype, within a half
    // type's rounding of Burn's half-precision convolution (bf16 keeps 8 bits: 2^-8 = 4e-3
    // per value, 2e-2 leaves room for the sums' rounding), gradients included.
    let training = Device::flex().autodiff();
    for dtype in [DType::BF16, DType::F16] {
        let conv = build(&training, 0, &case).map(&mut Cast(dtype));
        let x = Tensor::<4>::random([2, 3, 9, 9], Distribution::Normal(0.0, 1.0), &training)
            .cast(dtype);
        assert!(uses_kiln_kernel(&x));
        let upstream = conv.forward(x.clone()).detach().ones_like();
        let got = forward_and_grads(&conv, &x, &upstream, true);
        let want = forward_and_grads(&conv, &x, &upstream, false);
        assert_eq!(got.0.dtype(), dtype);
        for (what, got, want) in [
            ("output", got.0, want.0),
            ("input gradient", got.1, want.1),
            ("weight gradient", got.2, want.2),
        ] {
            assert_eq!(got.dtype(), dtype, "{dtype:?} {what}");
            let error = relative_error(got.cast(DType::F32), want.cast(DType::F32));
            assert!(error <= 2e-2, "{dtype:?}: {what} differs by {error}");
        }
    }
}

/// A module mapper casting every float parameter to one dtype.
struct Cast(DType);

impl burn::module::ModuleMapper for Cast {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<D>>,
    ) -> burn::module::Param<Tensor<D>> {
        let dtype = self.0;
        param.map(|t| t.cast(dtype).detach().require_grad())
    }
}

#[test]
fn f64_and_empty_inputs_take_burns_convolution() {
    let device = Device::flex().autodiff();
    let conv = build(&device, 0, &cases()[0]);
    let x = Tensor::<4>::random([2, 3, 9, 9], Distribution::Default, &device);
    assert!(!uses_kiln_kernel(&x.clone().cast(DType::F64)));
    // An empty batch gives an empty output and gradients instead of a panic.
    let empty = Tensor::<4>::zeros([0, 3, 9, 9], &device).require_grad();
    let out = conv2d(&conv, empty.clone());
    assert_eq!(out.dims(), [0, 8, 9, 9]);
    let grads = out.sum().backward();
    assert!(conv.weight.val().grad(&grads).is_some());
}
