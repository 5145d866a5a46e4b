//! Batch norm's per-plane sums: 16 interleaved lanes, each summed in f32 over runs of
//! [`F32_RUN`] values and flushed into an f64 total, the totals added pairwise at the end.
//!
//! A serial sum waits an add's latency for every element, while independent lanes run at
//! the adds' throughput; f32 runs keep the values unwidened (widening every value to f64 was
//! a conversion per element). The order is fixed by the length alone, so the result is the
//! same on any CPU and for any thread count. The compiler turned the portable loops into
//! 4-wide vectors at best, so CPUs with AVX-512 run the same operations, lane for lane and
//! unfused, as explicit 16-wide vectors: the same bits (tested).

use crate::isa::Isa;

/// Lanes of partial sums.
pub(crate) const LANES: usize = 16;

/// Values per lane summed in f32 before they join the lane's f64 total: 4 values round by
/// at most a few units in the 24th bit.
pub(crate) const F32_RUN: usize = 4;

/// What each value contributes to a sum.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Term {
    /// The value itself.
    Value,
    /// Its squared distance from a centre (a variance around the mean found first).
    SquaredFrom(f32),
}

impl Term {
    #[inline(always)]
    fn of(self, v: f32) -> f32 {
        match self {
            Term::Value => v,
            Term::SquaredFrom(centre) => (v - centre) * (v - centre),
        }
    }
}

/// `Σ term(v)` over `values`.
pub(crate) fn sum(values: &[f32], term: Term) -> f64 {
    let whole = values.len() / LANES * LANES;
    let mut totals = whole_chunk_totals(&values[..whole], term, Isa::current());
    for (index, &v) in values[whole..].iter().enumerate() {
        totals[index] += term.of(v) as f64;
    }
    add_lanes(totals)
}

/// `(Σ g, Σ g·(x − m))` over a plane `xs` and its gradient `gs` (of the same length).
///
/// # Panics
///
/// If the lengths differ.
pub(crate) fn gradient_sums(xs: &[f32], gs: &[f32], m: f32) -> (f64, f64) {
    assert_eq!(xs.len(), gs.len(), "gradient_sums: lengths differ");
    let whole = xs.len() / LANES * LANES;
    let (mut dy, mut dyx) =
        whole_chunk_gradient_totals(&xs[..whole], &gs[..whole], m, Isa::current());
    for (index, (&v, &g)) in xs[whole..].iter().zip(&gs[whole..]).enumerate() {
        dy[index] += g as f64;
        dyx[index] += (g * (v - m)) as f64;
    }
    (add_lanes(dy), add_lanes(dyx))
}

/// The lanes' totals over `values` (a whole number of [`LANES`]-long chunks) on `isa`.
fn whole_chunk_totals(values: &[f32], term: Term, isa: Isa) -> [f64; LANES] {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && Isa::detected() == Isa::Avx512 {
        // SAFETY: the CPU has AVX-512F (checked); `values` holds whole chunks (the callers
        // cut it so, and the function only reads `values.len() / 16` of them).
        return unsafe { totals_avx512(values, term) };
    }
    let _ = isa;
    let (mut totals, mut run) = ([0.0f64; LANES], [0.0f32; LANES]);
    for (index, chunk) in values.chunks_exact(LANES).enumerate() {
        for (r, &v) in run.iter_mut().zip(chunk) {
            *r += term.of(v);
        }
        if index % F32_RUN == F32_RUN - 1 {
            flush(&mut totals, &mut run);
        }
    }
    flush(&mut totals, &mut run);
    totals
}

/// The lanes' `(Σ g, Σ g·(x − m))` totals over whole chunks on `isa`.
fn whole_chunk_gradient_totals(
    xs: &[f32],
    gs: &[f32],
    m: f32,
    isa: Isa,
) -> ([f64; LANES], [f64; LANES]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && Isa::detected() == Isa::Avx512 {
        // SAFETY: the CPU has AVX-512F (checked); the function reads `min(len) / 16` whole
        // chunks of each slice.
        return unsafe { gradient_totals_avx512(xs, gs, m) };
    }
    let _ = isa;
    let (mut dy, mut dyx) = ([0.0f64; LANES], [0.0f64; LANES]);
    let (mut run_dy, mut run_dyx) = ([0.0f32; LANES], [0.0f32; LANES]);
    let chunks = xs.chunks_exact(LANES).zip(gs.chunks_exact(LANES));
    for (index, (x, g)) in chunks.enumerate() {
        for lane in 0..LANES {
            run_dy[lane] += g[lane];
            run_dyx[lane] += g[lane] * (x[lane] - m);
        }
        if index % F32_RUN == F32_RUN - 1 {
            flush(&mut dy, &mut run_dy);
            flush(&mut dyx, &mut run_dyx);
        }
    }
    flush(&mut dy, &mut run_dy);
    flush(&mut dyx, &mut run_dyx);
    (dy, dyx)
}

/// Adds a run's f32 partial sums to the f64 totals and starts the next run.
#[inline(always)]
fn flush(totals: &mut [f64; LANES], run: &mut [f32; LANES]) {
    for (total, r) in totals.iter_mut().zip(run.iter_mut()) {
        *total += *r as f64;
        *r = 0.0;
    }
}

/// The lanes' total, pairwise.
#[inline(always)]
fn add_lanes(mut l: [f64; LANES]) -> f64 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for lane in 0..width {
            l[lane] += l[lane + width];
        }
    }
    l[0]
}

/// An f32 run's 16 lanes added to the f64 totals (lanes 0–7, 8–15), exactly as [`flush`].
///
/// # Safety
///
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn flush_avx512(
    totals: &mut [std::arch::x86_64::__m512d; 2],
    run: std::arch::x86_64::__m512,
) {
    use std::arch::x86_64::{
        _mm256_castpd_ps, _mm512_add_pd, _mm512_castps_pd, _mm512_castps512_ps256, _mm512_cvtps_pd,
        _mm512_extractf64x4_pd,
    };
    let low = _mm512_castps512_ps256(run);
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(run)));
    totals[0] = _mm512_add_pd(totals[0], _mm512_cvtps_pd(low));
    totals[1] = _mm512_add_pd(totals[1], _mm512_cvtps_pd(high));
}

/// The two f64 halves as the portable lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn lanes_of(totals: [std::arch::x86_64::__m512d; 2]) -> [f64; LANES] {
    let mut lanes = [0.0f64; LANES];
    // SAFETY: `lanes` holds 16 f64, two unaligned 8-lane stores' worth.
    unsafe {
        std::arch::x86_64::_mm512_storeu_pd(lanes.as_mut_ptr(), totals[0]);
        std::arch::x86_64::_mm512_storeu_pd(lanes.as_mut_ptr().add(8), totals[1]);
    }
    lanes
}

/// [`whole_chunk_totals`] in 16-wide AVX-512 vectors: per lane the same f32 subtractions,
/// products and sums, unfused, in the same order, and the same flushes.
///
/// # Safety
///
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn totals_avx512(values: &[f32], term: Term) -> [f64; LANES] {
    use std::arch::x86_64::{
        _mm512_add_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_pd,
        _mm512_setzero_ps, _mm512_sub_ps,
    };
    let mut totals = [_mm512_setzero_pd(); 2];
    let mut run = _mm512_setzero_ps();
    for (index, chunk) in values.chunks_exact(LANES).enumerate() {
        // SAFETY: `chunk` holds 16 values.
        let v = unsafe { _mm512_loadu_ps(chunk.as_ptr()) };
        let t = match term {
            Term::Value => v,
            Term::SquaredFrom(centre) => {
                let d = _mm512_sub_ps(v, _mm512_set1_ps(centre));
                _mm512_mul_ps(d, d)
            }
        };
        run = _mm512_add_ps(run, t);
        if index % F32_RUN == F32_RUN - 1 {
            // SAFETY: AVX-512F, as this function.
            unsafe { flush_avx512(&mut totals, run) };
            run = _mm512_setzero_ps();
        }
    }
    // SAFETY: AVX-512F, as this function.
    unsafe {
        flush_avx512(&mut totals, run);
        lanes_of(totals)
    }
}

/// [`whole_chunk_gradient_totals`] in 16-wide AVX-512 vectors, lane for lane the same.
///
/// # Safety
///
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gradient_totals_avx512(xs: &[f32], gs: &[f32], m: f32) -> ([f64; LANES], [f64; LANES]) {
    use std::arch::x86_64::{
        _mm512_add_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_pd,
        _mm512_setzero_ps, _mm512_sub_ps,
    };
    let (mut dy, mut dyx) = ([_mm512_setzero_pd(); 2], [_mm512_setzero_pd(); 2]);
    let (mut run_dy, mut run_dyx) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let centre = _mm512_set1_ps(m);
    let chunks = xs.chunks_exact(LANES).zip(gs.chunks_exact(LANES));
    for (index, (x, g)) in chunks.enumerate() {
        // SAFETY: `x` and `g` hold 16 values each.
        let (x, g) = unsafe { (_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(g.as_ptr())) };
        run_dy = _mm512_add_ps(run_dy, g);
        run_dyx = _mm512_add_ps(run_dyx, _mm512_mul_ps(g, _mm512_sub_ps(x, centre)));
        if index % F32_RUN == F32_RUN - 1 {
            // SAFETY: AVX-512F, as this function.
            unsafe {
                flush_avx512(&mut dy, run_dy);
                flush_avx512(&mut dyx, run_dyx);
            }
            run_dy = _mm512_setzero_ps();
            run_dyx = _mm512_setzero_ps();
        }
    }
    // SAFETY: AVX-512F, as this function.
    unsafe {
        flush_avx512(&mut dy, run_dy);
        flush_avx512(&mut dyx, run_dyx);
        (lanes_of(dy), lanes_of(dyx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::values;

    /// Lengths around every boundary: chunks, runs, remainders.
    const LENGTHS: [usize; 12] = [0, 1, 15, 16, 17, 63, 64, 65, 80, 127, 1000, 4099];

    #[test]
    fn every_instruction_set_sums_the_same_bits() {
        let isas: Vec<Isa> = [Isa::Portable, Isa::Avx512]
            .into_iter()
            .filter(|isa| *isa <= Isa::detected())
            .collect();
        eprintln!("lane sums checked on {isas:?}");
        for len in LENGTHS {
            let xs = values(len, 3 + len as u64);
            let gs = values(len, 7 + len as u64);
            let whole = len / LANES * LANES;
            for term in [Term::Value, Term::SquaredFrom(0.3)] {
                let portable = whole_chunk_totals(&xs[..whole], term, Isa::Portable);
                for &isa in &isas {
                    let got = whole_chunk_totals(&xs[..whole], term, isa);
                    assert_eq!(got, portable, "{isa:?} {term:?} {len}");
                }
            }
            let portable =
                whole_chunk_gradient_totals(&xs[..whole], &gs[..whole], 0.2, Isa::Portable);
            for &isa in &isas {
                let got = whole_chunk_gradient_totals(&xs[..whole], &gs[..whole], 0.2, isa);
                assert_eq!(got, portable, "{isa:?} gradient {len}");
            }
        }
    }

    #[test]
    fn the_sums_match_f64_sums_closely() {
        for len in LENGTHS {
            let xs = values(len, 11);
            let gs = values(len, 12);
            let exact: f64 = xs.iter().map(|&v| v as f64).sum();
            let scale: f64 = xs.iter().map(|&v| (v as f64).abs()).sum::<f64>().max(1.0);
            assert!(
                (sum(&xs, Term::Value) - exact).abs() <= 1e-6 * scale,
                "{len}"
            );
            let squares: f64 = xs.iter().map(|&v| (v as f64 - 0.25).powi(2)).sum();
            let got = sum(&xs, Term::SquaredFrom(0.25));
            assert!((got - squares).abs() <= 1e-6 * squares.max(1.0), "{len}");
            let (dy, dyx) = gradient_sums(&xs, &gs, 0.1);
            let exact_dy: f64 = gs.iter().map(|&g| g as f64).sum();
            let exact_dyx: f64 = xs
                .iter()
                .zip(&gs)
                .map(|(&v, &g)| g as f64 * (v as f64 - 0.1))
                .sum();
            let scale: f64 = gs.iter().map(|&g| (g as f64).abs()).sum::<f64>().max(1.0);
            assert!((dy - exact_dy).abs() <= 1e-6 * scale, "{len}");
            assert!((dyx - exact_dyx).abs() <= 1e-5 * scale, "{len}");
        }
        // Control: the tolerance sees one value off by 0.01.
        let xs = values(100, 11);
        let off: f64 = xs.iter().map(|&v| v as f64).sum::<f64>() + 0.01;
        let scale: f64 = xs.iter().map(|&v| (v as f64).abs()).sum::<f64>().max(1.0);
        assert!((sum(&xs, Term::Value) - off).abs() > 1e-6 * scale);
    }
}
