//! gemm's throughput on the convolutions' product shapes, for scale beside the kernels'
//! per-layer times (`cargo xtask bench --only kernels`). Run with `cargo test --release -p
//! kiln-kernels gemm_speed -- --ignored --nocapture`.

use crate::gemm::{Matrix, matmul};
use crate::test_support::{fastest_ms, in_pool, values};

/// gemm's own throughput here, for scale: GFLOP/s of `[m × k] × [k × n]` products shaped like
/// the convolutions' (one thread).
#[test]
#[ignore]
fn gemm_speed() {
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
