//! The textbook pipeline bubble, to compare simulated timelines with (the two quantities
//! that go by that name are explained on [`bubble_formula`]).

use super::{ScheduleError, ScheduleKind};

/// The idle share of each stage's step under equal stage times: `(P − 1)/(M + P − 1)` for
/// GPipe and 1F1B, `(P − 1)/(v·M + P − 1)` for interleaved 1F1B with `v` chunks per device.
///
/// Two quantities go by "bubble" in the literature. Let every stage take `t_f` per forward
/// and `t_b` per backward of a micro-batch through all its layers (with `v` chunks per
/// stage, `t_f / v` and `t_b / v` per chunk):
///
/// - the ideal, bubble-free step is `M·(t_f + t_b)`; GPipe and 1F1B add a bubble of
///   `(P − 1)·(t_f + t_b)`, and interleaving with `v` chunks cuts it to
///   `(P − 1)·(t_f + t_b)/v` (Narayanan et al. 2021, §2.2). [`bubble_overhead`] is the
///   paper's *bubble time fraction*, bubble ÷ ideal step: `(P − 1)/M`, or `(P − 1)/(v·M)`;
/// - this function is the share of the actual step a stage spends idle, bubble ÷
///   (ideal + bubble) = overhead ÷ (1 + overhead). That is what
///   [`Timeline::bubble_fraction`](super::Timeline::bubble_fraction) measures.
///
/// Simulated under [`Costs::uniform`](super::Costs::uniform) (the same times on every
/// virtual stage), all three generated schedules take exactly `v·M + P − 1` times one
/// virtual stage's forward plus backward, whatever the forward/backward ratio (the tests
/// check 1:1, 1:2, 0.3:1.7, 2:1 and 1:10 over every legal shape up to `P = 6`, `M = 16`,
/// `v = 4`), so their measured bubble equals this formula to rounding.
pub fn bubble_formula(
    kind: ScheduleKind,
    stages: usize,
    micro_batches: usize,
) -> Result<f64, ScheduleError> {
    let ratio = bubble_overhead(kind, stages, micro_batches)?;
    Ok(ratio / (1.0 + ratio))
}

/// Narayanan et al.'s bubble time fraction, the bubble ÷ the ideal (bubble-free) step:
/// `(P − 1)/M` for GPipe and 1F1B, `(P − 1)/(v·M)` for interleaved 1F1B (see
/// [`bubble_formula`] for how the two relate).
pub fn bubble_overhead(
    kind: ScheduleKind,
    stages: usize,
    micro_batches: usize,
) -> Result<f64, ScheduleError> {
    kind.check(stages, micro_batches)?;
    Ok((stages - 1) as f64 / (kind.chunks() * micro_batches) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_follow_the_literature() {
        let one_f_one_b = bubble_formula(ScheduleKind::OneFOneB, 4, 8).unwrap();
        assert!((one_f_one_b - 3.0 / 11.0).abs() < 1e-12);
        let interleaved = ScheduleKind::Interleaved { virtual_stages: 2 };
        assert!((bubble_overhead(interleaved, 4, 8).unwrap() - 3.0 / 16.0).abs() < 1e-12);
        assert!((bubble_formula(interleaved, 4, 8).unwrap() - 3.0 / 19.0).abs() < 1e-12);
        assert_eq!(bubble_formula(ScheduleKind::GPipe, 1, 5).unwrap(), 0.0);
        assert!(bubble_formula(ScheduleKind::OneFOneB, 4, 2).is_err());
    }
}
