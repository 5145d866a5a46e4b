//! The parts inside kiln's CPU kernels, one at a time on one thread: gemm's throughput on the
//! convolutions' product shapes (for scale beside the `kernels` bench's per-layer times),
//! im2col's columns, Winograd F(4×4, 3×3)'s input transform, 36 products and output
//! transform per block of images at several block sizes (both layouts of each transform), and
//! ResNet-18's batch norms forward and backward against Burn's own batch norm.

use burn::tensor::{Device, Distribution, Tensor};
use kiln::kernels::{ConvBlock, KernelPart, batch_norm_train};

use super::Output;
use crate::BenchArgs;
use crate::measure::fastest_ms;
use crate::report::{Figure, Target};

const NAME: &str = "kernel-parts";

/// `(m, k, n)` of the convolutions' products at width 64 (and one square for scale).
const GEMMS: [(usize, usize, usize); 7] = [
    (128, 1152, 256),
    (128, 1152, 512),
    (64, 576, 256),
    (64, 576, 2048),
    (32, 288, 256),
    (512, 512, 512),
    (256, 1152, 1024),
];

/// `(channels, size, images per block)`: ResNet-18's 3×3 unit-stride shapes at width 64.
const WINOGRAD_BLOCKS: [(usize, usize, usize); 6] = [
    (64, 32, 1),
    (64, 32, 2),
    (64, 32, 4),
    (128, 16, 4),
    (128, 16, 8),
    (128, 16, 16),
];

/// `(channels, size)` of the narrow stride-1 layers im2col serves, 16 images per block.
const IM2COL_SHAPES: [(usize, usize); 4] = [(128, 4), (512, 4), (64, 8), (16, 32)];

/// ResNet-18's batch norms at width 16, batch 32.
const BATCH_NORMS: [[usize; 4]; 4] = [
    [32, 16, 32, 32],
    [32, 32, 16, 16],
    [32, 64, 8, 8],
    [32, 128, 4, 4],
];

/// One part's time (and throughput where it is a product), printed and as figures.
fn time_part(part: KernelPart, repeat: usize) -> Result<Vec<Figure>, String> {
    let prepared = part
        .prepare()
        .ok_or_else(|| format!("{part}: an empty shape"))?;
    let ms = fastest_ms(repeat, || prepared.run());
    let mut figures = vec![Figure::new(NAME, format!("{part}, 1 thread"), ms, "ms")];
    match part.flops() {
        Some(flops) => {
            let gflops = flops / ms / 1e6;
            println!("{part}: {ms:.3} ms, {gflops:.0} GFLOP/s");
            figures.push(Figure::new(
                NAME,
                format!("{part} throughput, 1 thread"),
                gflops,
                "GFLOP/s",
            ));
        }
        None => println!("{part}: {ms:.3} ms"),
    }
    Ok(figures)
}

/// kiln's and Burn's batch norm, forward and backward, on one shape: (kiln ms, Burn ms).
fn batch_norm_ms(shape: [usize; 4], repeat: usize) -> (f64, f64) {
    let device = Device::flex().autodiff();
    let x = Tensor::<4>::random(shape, Distribution::Normal(0.5, 2.0), &device);
    let gamma = Tensor::<1>::random([shape[1]], Distribution::Normal(1.0, 0.3), &device);
    let beta = Tensor::<1>::random([shape[1]], Distribution::Normal(0.0, 0.3), &device);
    let upstream = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let step = |kiln: bool| {
        let x = x.clone().detach().require_grad();
        let (gamma, beta) = (gamma.clone().require_grad(), beta.clone().require_grad());
        let output = if kiln {
            batch_norm_train(x.clone(), gamma, beta, 1e-5).output
        } else {
            burn::tensor::module::batch_norm_train(x.clone(), gamma, beta, 1e-5).output
        };
        let grads = (output * upstream.clone()).sum().backward();
        x.grad(&grads).expect("x's gradient").into_data()
    };
    (
        fastest_ms(repeat, || step(true)),
        fastest_ms(repeat, || step(false)),
    )
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    // The smoke run takes one small shape of each kind.
    let (take, repeat) = if args.quick { (1, 2) } else { (usize::MAX, 5) };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let mut out = Output::default();
    println!("{NAME}: one thread, fastest of {repeat} runs after a warm-up");
    let mut parts: Vec<KernelPart> = Vec::new();
    let quick_scale = |v: usize| if args.quick { v.div_ceil(8) } else { v };
    for (m, k, n) in GEMMS.into_iter().take(take) {
        let (m, k, n) = (quick_scale(m), quick_scale(k), quick_scale(n));
        parts.push(KernelPart::Gemm { m, k, n });
    }
    for (channels, size) in IM2COL_SHAPES.into_iter().take(take) {
        let (channels, images) = (quick_scale(channels), quick_scale(16));
        parts.push(KernelPart::Im2col(ConvBlock {
            channels,
            size,
            images,
        }));
    }
    for (channels, size, images) in WINOGRAD_BLOCKS.into_iter().take(take) {
        let block = ConvBlock {
            channels: quick_scale(channels),
            size,
            images,
        };
        parts.extend([
            KernelPart::Winograd4Input(block),
            KernelPart::Winograd4InputAcrossImages(block),
            KernelPart::Winograd4Products(block),
            KernelPart::Winograd4Output(block),
            KernelPart::Winograd4OutputAcrossImages(block),
        ]);
    }
    for part in parts {
        out.figures
            .extend(pool.install(|| time_part(part, repeat))?);
    }
    for shape in BATCH_NORMS.into_iter().take(take) {
        let shape = if args.quick {
            [4, shape[1], 8, 8]
        } else {
            shape
        };
        let (kiln_ms, burn_ms) = pool.install(|| batch_norm_ms(shape, repeat));
        println!(
            "batch norm {shape:?} forward + backward: kiln {kiln_ms:.2} ms, Burn {burn_ms:.2} ms"
        );
        out.figures.push(Figure::new(
            NAME,
            format!("batch norm {shape:?} forward + backward, kiln, 1 thread"),
            kiln_ms,
            "ms",
        ));
        out.figures.push(
            Figure::new(
                NAME,
                format!("Burn's batch norm time / kiln's, {shape:?}, 1 thread"),
                burn_ms / kiln_ms.max(1e-12),
                "x",
            )
            .target(Target::AtLeast(1.0)),
        );
    }
    Ok(out)
}
