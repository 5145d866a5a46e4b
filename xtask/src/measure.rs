//! Repeated measurements: warm-up, repetitions, median and spread.

use std::time::Instant;

/// Median and relative spread ((max − min) / median) of samples.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub median: f64,
    pub spread: f64,
}

pub fn stats(mut samples: Vec<f64>) -> Stats {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        0.5 * (samples[n / 2 - 1] + samples[n / 2])
    };
    let spread = (samples[n - 1] - samples[0]) / median.abs().max(1e-300);
    Stats { median, spread }
}

/// Runs `f` `warmup` times, then times it `reps` times (seconds per call).
pub fn time(warmup: usize, reps: usize, mut f: impl FnMut()) -> Stats {
    for _ in 0..warmup {
        f();
    }
    stats(
        (0..reps)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// The fastest of `repeat` runs of `f` after one warm-up, in milliseconds (what a kernel's
/// time is judged by: the noise of a shared machine only adds).
pub fn fastest_ms<T>(repeat: usize, f: impl Fn() -> T) -> f64 {
    std::hint::black_box(f());
    (0..repeat)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}
