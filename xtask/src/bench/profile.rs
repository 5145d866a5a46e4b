//! Where a ResNet-18 training step's time goes on the CPU backend: every convolution of the
//! model timed on its own with kiln's kernel (forward, input-gradient and weight-gradient
//! halves), beside the whole step, a GEMM of the same size as each forward (what an im2col
//! formulation costs at best), and kiln's kernel against Burn's own convolution.

use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2dConfig;
use burn::tensor::{Device, Distribution, Tensor};
use kiln::kernels::{ConvGeometry, conv2d_with};

use super::Output;
use super::throughput::{Setting, cores, images_per_sec};
use super::workload::{BATCH, devices, steps};
use crate::BenchArgs;
use crate::measure::time;
use crate::report::Figure;

const NAME: &str = "profile";

/// One convolution shape of ResNet-18 (CIFAR stem) and how often a step runs it.
#[derive(Debug, Clone, Copy)]
struct ConvShape {
    input: [usize; 2],
    channels: [usize; 2],
    kernel: usize,
    stride: usize,
    count: usize,
}

impl ConvShape {
    fn padding(&self) -> usize {
        self.kernel / 2
    }

    fn output(&self) -> usize {
        (self.input[0] + 2 * self.padding() - self.kernel) / self.stride + 1
    }

    /// Multiply-adds x 2 of the forward (each backward half costs the same).
    fn flops(&self, batch: usize) -> f64 {
        let out = self.output();
        2.0 * (batch * self.channels[1] * out * out * self.channels[0] * self.kernel * self.kernel)
            as f64
    }

    fn label(&self) -> String {
        format!(
            "{}x{} {}->{} k{} s{} (x{})",
            self.input[0],
            self.input[1],
            self.channels[0],
            self.channels[1],
            self.kernel,
            self.stride,
            self.count
        )
    }
}

/// ResNet-18's convolutions with the CIFAR stem, base width `w`, 32x32 inputs.
fn resnet18_convs(w: usize) -> Vec<ConvShape> {
    let conv = |size: usize, cin, cout, kernel, stride, count| ConvShape {
        input: [size, size],
        channels: [cin, cout],
        kernel,
        stride,
        count,
    };
    let mut shapes = vec![conv(32, 3, w, 3, 1, 1), conv(32, w, w, 3, 1, 4)];
    for (stage, size) in [(1, 32), (2, 16), (3, 8)] {
        let (cin, cout) = (w << (stage - 1), w << stage);
        shapes.push(conv(size, cin, cout, 3, 2, 1)); // first block's strided conv
        shapes.push(conv(size, cin, cout, 1, 2, 1)); // its 1x1 downsample
        shapes.push(conv(size / 2, cout, cout, 3, 1, 3));
    }
    shapes
}

/// Seconds of kiln's convolution kernel on one shape: the forward, each backward half (a
/// forward and backward with only that operand tracked, less the forward; the product with
/// the upstream gradient and its sum are included), and an equally sized GEMM ([N·Ho·Wo,
/// Cin·k·k] x [Cin·k·k, Cout]).
fn time_shape(device: &Device, shape: ConvShape, reps: usize) -> [f64; 4] {
    let [cin, cout] = shape.channels;
    let (k, s, p, out) = (shape.kernel, shape.stride, shape.padding(), shape.output());
    let normal = Distribution::Normal(0.0, 1.0);
    let training = device.clone().autodiff();
    let x = Tensor::<4>::random(
        [BATCH, cin, shape.input[0], shape.input[1]],
        normal,
        &training,
    );
    let weight = Tensor::<4>::random([cout, cin, k, k], normal, &training);
    let grad = Tensor::<4>::random([BATCH, cout, out, out], normal, &training);
    let geometry = ConvGeometry::new()
        .with_stride([s, s])
        .with_padding([(p, p), (p, p)]);
    let forward = time(1, reps, || {
        let _ = conv2d_with(x.clone(), weight.clone(), None, geometry);
    });
    let tracked = |input: bool| {
        time(1, reps, || {
            let (x, weight) = if input {
                (x.clone().require_grad(), weight.clone())
            } else {
                (x.clone(), weight.clone().require_grad())
            };
            let _ = (conv2d_with(x, weight, None, geometry) * grad.clone())
                .sum()
                .backward();
        })
        .median
    };
    let input_grad = (tracked(true) - forward.median).max(0.0);
    let weight_grad = (tracked(false) - forward.median).max(0.0);
    let lhs = Tensor::<2>::random([BATCH * out * out, cin * k * k], normal, device);
    let rhs = Tensor::<2>::random([cin * k * k, cout], normal, device);
    let gemm = time(1, reps, || {
        let _ = lhs.clone().matmul(rhs.clone());
    });
    [forward.median, input_grad, weight_grad, gemm.median]
}

/// Seconds of one training forward + backward of `shape`'s convolution (input and weight
/// gradients) with Burn's `Conv2d::forward` and with kiln's convolution kernel (`kiln::kernels`).
fn time_training(device: &Device, shape: ConvShape, reps: usize) -> [f64; 2] {
    let [cin, cout] = shape.channels;
    let (k, s, p) = (shape.kernel, shape.stride, shape.padding());
    let conv = kiln::core::init_module(device, 7, || {
        Conv2dConfig::new([cin, cout], [k, k])
            .with_stride([s, s])
            .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
            .with_bias(false)
            .init(device)
    });
    let normal = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<4>::random([BATCH, cin, shape.input[0], shape.input[1]], normal, device)
        .require_grad();
    let out = shape.output();
    let upstream = Tensor::<4>::random([BATCH, cout, out, out], normal, device);
    let step = |kiln: bool| {
        let y = if kiln {
            kiln::kernels::conv2d(&conv, x.clone())
        } else {
            conv.forward(x.clone())
        };
        let _ = (y * upstream.clone()).sum().backward();
    };
    [
        time(1, reps, || step(false)).median,
        time(1, reps, || step(true)).median,
    ]
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let devices = devices(&args.devices)?;
    let device = devices[0].clone();
    let width = 16;
    let reps = if args.quick { 3 } else { 9 };
    let (warmup, measured) = steps(args.quick);
    let threads = cores();
    // The whole step, one replica on every core, for the share each part takes.
    let setting = Setting {
        width,
        replicas: 1,
        threads,
    };
    let (images, _) = images_per_sec(&devices, setting, warmup, measured)?;
    let step = BATCH as f64 / images;
    // Time the ops inside a pool of the same size as the step's.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut totals = [0.0; 4];
    let mut training = [0.0; 2];
    for shape in resnet18_convs(width) {
        let times = pool.install(|| time_shape(&device, shape, reps));
        let gflops = |t: f64| shape.flops(BATCH) / t / 1e9;
        for (total, t) in totals.iter_mut().zip(times) {
            *total += t * shape.count as f64;
        }
        let [burn_conv, kiln_conv] =
            pool.install(|| time_training(&device.clone().autodiff(), shape, reps));
        training[0] += burn_conv * shape.count as f64;
        training[1] += kiln_conv * shape.count as f64;
        out.figures.push(Figure::new(
            NAME,
            format!("{}: kiln kernel / Burn conv (fwd+bwd)", shape.label()),
            kiln_conv / burn_conv,
            "ratio",
        ));
        for (part, seconds) in ["fwd", "dX", "dW", "same-size gemm"].iter().zip(times) {
            out.figures.push(Figure::new(
                NAME,
                format!("{}: {part} GFLOP/s", shape.label()),
                gflops(seconds),
                "GFLOP/s",
            ));
        }
    }
    let convs = totals[0] + totals[1] + totals[2];
    for (part, seconds) in [
        ("conv forward", totals[0]),
        ("conv input gradient", totals[1]),
        ("conv weight gradient", totals[2]),
        (
            "everything else (BN, elementwise, pool, optimizer, copies)",
            step - convs,
        ),
    ] {
        out.figures.push(Figure::new(
            NAME,
            format!("w{width} step share: {part}"),
            seconds / step,
            "fraction",
        ));
    }
    out.figures.push(Figure::new(
        NAME,
        format!("w{width} step ({threads} threads)"),
        step * 1e3,
        "ms",
    ));
    out.figures.push(Figure::new(
        NAME,
        format!("w{width} all convolutions, fwd+bwd: kiln kernel / Burn conv"),
        training[1] / training[0],
        "ratio",
    ));
    out.figures.push(Figure::new(
        NAME,
        format!("w{width} convolutions at gemm speed / as run"),
        totals[3] * 3.0 / convs,
        "ratio",
    ));
    Ok(out)
}
