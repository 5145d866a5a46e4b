//! `erf` and `exp` in straight-line f32 arithmetic, so that GELU's loops vectorise.
//!
//! libm's `erff` branches on the argument's range and runs one element at a time: in the
//! GPT's MLP it was about a tenth of a training step. These have no branches and no calls, so
//! under [`simd`](crate::simd::simd) the compiler runs them 8 or 16 lanes at a time. They are
//! not libm's bits: `erf` is fdlibm's rational function below 0.84375 and Abramowitz and
//! Stegun's 7.1.26 above (absolute error below 1.5e-7, the approximation PyTorch's vectorised
//! CPU `erf` uses everywhere), and `exp` is Cephes' `expf`
//! polynomial after a Cody–Waite reduction (within 2 ulp of the true value). Every operation
//! is an IEEE one (no fused multiply-add), so any CPU and vector width gives the same bits.

/// `e^x` for `x` in −87.3..=88.7 (the normal range of the result), `e^−87.3` below it and
/// `e^88.7` above it (NaN stays NaN).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n · LN2_HIGH` is exact for the `n` that occur.
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Adding and taking away 1.5·2²³ rounds to the nearest integer (ties to even) in plain
    // f32 arithmetic, which every vector width has (a rounding instruction needs SSE4.1).
    const ROUNDER: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let n = (x * LOG2_E + ROUNDER) - ROUNDER;
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * (r * r) + r + 1.0;
    // 2^n from its exponent bits: n is within −126..=128 after the clamp, and 2^128 only
    // meets the clamp's top where e_r < 1. The exponent is biased in f32: an integer addition
    // carries an overflow check in debug builds, and its branch stops the loop vectorising.
    let scale = f32::from_bits(((n + 127.0).clamp(1.0, 254.0) as u32) << 23);
    let high = if n > 127.0 { 2.0 } else { 1.0 };
    e_r * scale * high
}

/// The error function, `erf(x) = 2/√π ∫₀ˣ e^(−t²) dt`, within 2.5e-7 (absolute) of libm's;
/// NaN stays NaN, ±∞ gives ±1. Both halves are computed and one is chosen (no branch).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let small = erf_small(x);
    let large = erf_large(x);
    if x.abs() < 0.843_75 { small } else { large }
}

/// `erf` for `|x| < 0.84375` as fdlibm's `erff` computes it there, `x + x·P(x²)/Q(x²)`: within
/// an ulp, where the large half's `1 − …` would lose the small values' digits.
#[inline(always)]
fn erf_small(x: f32) -> f32 {
    const PP: [f32; 5] = [
        1.283_791_7e-1,
        -3.250_421e-1,
        -2.848_175e-2,
        -5.770_270_2e-3,
        -2.376_301_7e-5,
    ];
    const QQ: [f32; 5] = [
        3.979_172e-1,
        6.502_225e-2,
        5.081_306e-3,
        1.324_947_4e-4,
        -3.960_228_2e-6,
    ];
    let z = x * x;
    let r = PP[0] + z * (PP[1] + z * (PP[2] + z * (PP[3] + z * PP[4])));
    let s = 1.0 + z * (QQ[0] + z * (QQ[1] + z * (QQ[2] + z * (QQ[3] + z * QQ[4]))));
    x + x * (r / s)
}

/// `erf` by Abramowitz and Stegun's 7.1.26, within 1.5e-7 of the true value (meant for
/// `|x| ≥ 0.84375`, where `erf` is above 0.76).
#[inline(always)]
fn erf_large(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A1: f32 = 0.254_829_6;
    const A2: f32 = -0.284_496_74;
    const A3: f32 = 1.421_413_8;
    const A4: f32 = -1.453_152_1;
    const A5: f32 = 1.061_405_4;
    let a = x.abs();
    let t = 1.0 / (1.0 + P * a);
    let poly = ((((A5 * t + A4) * t + A3) * t + A2) * t + A1) * t;
    // `a · a` overflows to ∞ past 1.8e19: the clamp in `exp` makes that 0, as it should be.
    let y = 1.0 - poly * exp(-(a * a));
    y.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::{erf, exp};

    /// Every 997th f32 bit pattern in `[lo, hi]` (both signs), and the ends.
    fn samples(lo: f32, hi: f32) -> Vec<f32> {
        let (lo, hi) = (lo.to_bits(), hi.to_bits());
        let mut values: Vec<f32> = (lo..hi).step_by(997).map(f32::from_bits).collect();
        values.push(f32::from_bits(hi));
        values.extend(values.clone().into_iter().map(|v| -v));
        values
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_true_value() {
        for x in samples(1e-8, 87.0) {
            let ours = exp(x);
            let truth = f64::from(x).exp();
            let ulp = f64::from(f32::EPSILON) * truth;
            assert!(
                (f64::from(ours) - truth).abs() <= 2.0 * ulp,
                "exp({x}) = {ours}, true {truth}"
            );
        }
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-200.0) < 1e-37 && exp(-200.0) > 0.0);
        assert!(exp(f32::INFINITY).is_finite());
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn erf_is_within_its_bound_of_libm() {
        let mut worst = 0.0_f32;
        for x in samples(1e-10, 12.0) {
            let error = (erf(x) - libm::erff(x)).abs();
            worst = worst.max(error);
        }
        // A&S 7.1.26 is within 1.5e-7 of erf; libm's `erff` within an ulp (6e-8 near 1).
        assert!(worst < 2.5e-7, "worst difference {worst}");
        // The control: a coarser approximation (A&S 7.1.25, within 2.5e-5) misses the bound.
        let coarse = |x: f32| {
            let t = 1.0 / (1.0 + 0.470_47 * x.abs());
            let poly = ((0.747_855_6 * t - 0.095_879_8) * t + 0.348_024_2) * t;
            (1.0 - poly * (-(x * x)).exp()).copysign(x)
        };
        let coarse_worst = samples(1e-10, 12.0)
            .into_iter()
            .map(|x| (coarse(x) - libm::erff(x)).abs())
            .fold(0.0, f32::max);
        assert!(
            coarse_worst >= 2.5e-7,
            "the control met the bound: {coarse_worst}"
        );
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert!(erf(f32::NAN).is_nan());
    }
}
