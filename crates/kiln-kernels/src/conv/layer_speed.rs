//! Each of ResNet-18's convolutions (CIFAR stem, batch 32) timed alone (one thread unless
//! `KILN_LAYER_THREADS` says otherwise): forward,
//! input gradient and weight gradient by the path kiln picks, to set beside PyTorch's
//! figures for the same shapes (`python3 xtask/peer/conv_layers.py`). Run with
//! `cargo test --release -p kiln-kernels layer_speed -- --ignored --nocapture`
//! (`KILN_LAYER_WIDTH=64` for width 64).

use crate::conv::flex::{forward_values, input_gradient, weight_gradient};
use crate::conv::geometry::ConvGeometry;
use crate::test_support::{conv_dims, fastest_ms, in_pool, values};

/// `(in channels, out channels, input size, kernel, stride, count in the network)`.
fn resnet18_convolutions(width: usize) -> Vec<(usize, usize, usize, usize, usize, usize)> {
    let w = width;
    vec![
        (3, w, 32, 3, 1, 1),
        (w, w, 32, 3, 1, 4),
        (w, 2 * w, 32, 3, 2, 1),
        (2 * w, 2 * w, 16, 3, 1, 3),
        (w, 2 * w, 32, 1, 2, 1),
        (2 * w, 4 * w, 16, 3, 2, 1),
        (4 * w, 4 * w, 8, 3, 1, 3),
        (2 * w, 4 * w, 16, 1, 2, 1),
        (4 * w, 8 * w, 8, 3, 2, 1),
        (8 * w, 8 * w, 4, 3, 1, 3),
        (4 * w, 8 * w, 8, 1, 2, 1),
    ]
}

#[test]
#[ignore]
fn layer_speed() {
    let width = std::env::var("KILN_LAYER_WIDTH")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(16);
    // KILN_LAYER_INDEX=i times only the i-th shape, KILN_LAYER_REPEAT=n takes the
    // fastest of n rounds (3).
    let only: Option<usize> = std::env::var("KILN_LAYER_INDEX")
        .ok()
        .and_then(|i| i.parse().ok());
    let repeat: usize = std::env::var("KILN_LAYER_REPEAT")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    // KILN_LAYER_THREADS=n runs in a pool of n threads (1).
    let threads: usize = std::env::var("KILN_LAYER_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let batch = 32;
    let mut totals = [0.0f64; 3];
    in_pool(threads, || {
        let layers = resnet18_convolutions(width).into_iter().enumerate();
        let chosen = layers.filter(|(i, _)| only.is_none_or(|o| o == *i));
        for (_, (cin, cout, size, k, stride, count)) in chosen {
            let pad = k / 2;
            let g = ConvGeometry::new()
                .with_stride([stride, stride])
                .with_padding([(pad, pad), (pad, pad)]);
            let d = conv_dims(cin, [size, size], [k, k], g);
            let x = values(batch * d.image_len(), 1);
            let weight = values(cout * d.rows(), 2);
            let grad = values(batch * cout * d.positions(), 3);
            // The machine is shared: the fastest of `repeat` rounds of fastest-of-5.
            let best = |f: &dyn Fn() -> Vec<f32>| {
                (0..repeat)
                    .map(|_| fastest_ms(f))
                    .fold(f64::INFINITY, f64::min)
            };
            let f = best(&|| forward_values(&x, &weight, &d, batch, cout));
            let i = if cin == 3 {
                0.0
            } else {
                best(&|| input_gradient(&weight, &grad, &d, batch, cout))
            };
            let w = best(&|| weight_gradient(&x, &grad, &d, batch, cout));
            println!(
                "{cin:>4}->{cout:<4} {size:>2}x{size:<2} k{k} s{stride} x{count}: forward {f:7.2} input grad {i:7.2} weight grad {w:7.2} ms"
            );
            for (total, t) in totals.iter_mut().zip([f, i, w]) {
                *total += t * count as f64;
            }
        }
    });
    let [f, i, w] = totals;
    println!(
        "width {width}, {threads} thread(s), all layers: forward {f:.1} input grad {i:.1} weight grad {w:.1} ms, sum {:.1} ms",
        f + i + w
    );
}

/// gemm's own throughput here, for scale: GFLOP/s of `[m × k] × [k × n]` products shaped like
/// the convolutions' (one thread).
#[test]
#[ignore]
fn gemm_speed() {
    use crate::gemm::{Matrix, matmul};
    in_pool(1, || {
        for (m, k, n) in [
            (128, 1152, 256),
            (128, 1152, 512),
            (64, 576, 256),
            (64, 576, 2048),
            (32, 288, 256),
            (512, 512, 512),
            (256, 1152, 1024),
        ] {
            let a = values(m * k, 1);
            let b = values(k * n, 2);
            let ms = (0..3)
                .map(|_| {
                    fastest_ms(&|| {
                        let mut c = vec![0.0; m * n];
                        matmul(
                            &mut c,
                            false,
                            (&a, Matrix::row_major(m, k)),
                            (&b, Matrix::row_major(k, n)),
                        );
                        c
                    })
                })
                .fold(f64::INFINITY, f64::min);
            let gflops = 2.0 * (m * k * n) as f64 / ms / 1e6;
            println!("{m}x{k}x{n}: {ms:.3} ms, {gflops:.0} GFLOP/s");
        }
    });
}

/// Every path's time for each 3×3 unit-stride shape of ResNet-18 at widths 16 and 64 (one
/// thread, batch 32, rounds interleaved, fastest of each; "-" where a path does not apply):
/// the measurements behind the dispatch's thresholds. `cargo test --release -p kiln-kernels
/// conv_path_speed -- --ignored --nocapture`.
/// A path's name, whether it applies, and a run of it.
type Path<'a> = (&'static str, bool, &'a dyn Fn() -> Vec<f32>);

#[test]
#[ignore]
fn conv_path_speed() {
    use crate::conv::flex::{im2col_forward, im2col_weight_gradient};
    use crate::conv::shifted;
    use crate::conv::winograd::{f2, f4};
    in_pool(1, || {
        for (c, size) in [
            (16, 32),
            (32, 16),
            (64, 8),
            (128, 4),
            (64, 32),
            (128, 16),
            (256, 8),
            (512, 4),
        ] {
            let g = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
            let d = conv_dims(c, [size, size], [3, 3], g);
            let batch = 32;
            let x = values(batch * d.image_len(), 1);
            let weight = values(c * d.rows(), 2);
            let grad = values(batch * c * d.positions(), 3);
            let fits = f2::shape_fits(&d, c);
            let paths: [Path; 9] = [
                ("forward F(4x4)", fits && size >= 4, &|| {
                    f4::forward(&x, &weight, &d, batch, c)
                }),
                ("F(2x2)", fits, &|| f2::forward(&x, &weight, &d, batch, c)),
                ("shifted", shifted::applies(&d), &|| {
                    shifted::forward(&x, &weight, &d, batch, c)
                }),
                ("im2col", true, &|| {
                    im2col_forward(&x, &weight, &d, batch, c)
                }),
                (
                    "direct",
                    crate::conv::direct::forward::applies(&d, c),
                    &|| crate::conv::direct::forward::forward(&x, &weight, &d, batch, c),
                ),
                ("| weight gradient F(2x2)", fits, &|| {
                    f2::weight_gradient(&x, &grad, &d, batch, c)
                }),
                ("shifted", shifted::applies(&d), &|| {
                    shifted::weight_gradient(&x, &grad, &d, batch, c)
                }),
                ("im2col", true, &|| {
                    im2col_weight_gradient(&x, &grad, &d, batch, c)
                }),
                (
                    "direct",
                    crate::conv::direct::weight_gradient::applies(&d, c),
                    &|| {
                        crate::conv::direct::weight_gradient::weight_gradient(
                            &x, &grad, &d, batch, c,
                        )
                    },
                ),
            ];
            let mut times = [f64::INFINITY; 9];
            for _ in 0..3 {
                for ((_, applies, run), time) in paths.iter().zip(&mut times) {
                    if *applies {
                        *time = time.min(fastest_ms(*run));
                    }
                }
            }
            let line: Vec<String> = paths
                .iter()
                .zip(times)
                .map(|((name, applies, _), time)| match applies {
                    true => format!("{name} {time:.2}"),
                    false => format!("{name} -"),
                })
                .collect();
            println!("{c:>3} ch {size:>2}x{size:<2}: {} ms", line.join("  "));
        }
    });
}
