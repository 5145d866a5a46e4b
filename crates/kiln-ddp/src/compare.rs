//! Comparing replicas with the single-device reference (see `test_support`).
//!
//! Tolerance, stated once: after several SGD-with-momentum steps, every parameter tensor of
//! every replica has moved like the single-device reference, to a relative error of 5e-5 in
//! f32, 2e-2 with f16/bf16 compression and 5e-2 with bf16 compute (mixed precision). The
//! error is taken on the *changes*: per tensor, max |got − want| over max |want − start|,
//! where `start` is the common initial model. (Taken relative to the parameters themselves, a
//! wrong update hides inside the tolerance after a few small steps.) Tensors that do not train
//! (zero exact gradient) are compared relative to their values instead, see [`STILL`]. The
//! controls in `tests.rs` and `precision_tests.rs` show that wrong updates exceed the
//! tolerances.

use crate::test_support::start_of;

/// Where replicas moved least like the reference: the largest relative error of a change
/// (see the module docs), with the replica and tensor it occurred in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ChangeError {
    pub error: f32,
    pub rank: usize,
    pub tensor: usize,
}

/// A reference tensor whose largest change is below this fraction of its largest value only
/// moved by rounding (its exact gradient is zero, e.g. a convolution's bias ahead of batch
/// norm), so its change is noise: it is compared relative to its values instead. (In these
/// tests, tensors that train move by 1% of their values or more, ResNet-18's included;
/// rounding moves the others by under 3e-7 of theirs.)
/// Tolerance on parameter changes for f32 data-parallel runs against one device. Measured
/// errors here are 4.5e-7 to 4.4e-6; the margin is for other CPUs' kernels and summation
/// orders, and the control that must fail (a 0.01 % learning-rate error) measures 2.3e-4.
pub(crate) const EXACT: f32 = 5e-5;
/// Tolerance with f16/bf16 compression on the wire (measured 1.1e-3 and 7.1e-3).
pub(crate) const COMPRESSED: f32 = 2e-2;
/// Tolerance for bf16 compute (mixed precision) against bf16 on one device: the replicas'
/// weight gradients are rounded to bf16 per half batch instead of once over the union
/// (measured 8.6e-3 to 1.8e-2; the unsynchronised control 0.65).
pub(crate) const HALF: f32 = 5e-2;

const STILL: f32 = 1e-4;

/// The worst relative error of the replicas' parameter changes against the reference's,
/// all starting from `start` (see the module docs, and [`STILL`] for tensors that do not
/// train). Panics if no tensor of the reference moved, or if the shapes disagree.
pub(crate) fn change_error(
    replicas: &[Vec<Vec<f32>>],
    reference: &[Vec<f32>],
    start: &[Vec<f32>],
    what: &str,
) -> ChangeError {
    assert_eq!(reference.len(), start.len(), "{what}: reference vs start");
    let changes: Vec<(f32, f32)> = reference
        .iter()
        .zip(start)
        .enumerate()
        .map(|(index, (want, from))| {
            assert_eq!(want.len(), from.len(), "{what}: tensor {index}");
            let values = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            (max_abs_difference(want, from), values)
        })
        .collect();
    assert!(
        changes
            .iter()
            .any(|&(change, values)| change > STILL * values),
        "{what}: the reference did not move"
    );
    let scales: Vec<f32> = changes
        .iter()
        .map(|&(change, values)| {
            if change > STILL * values {
                change
            } else {
                values.max(1e-6)
            }
        })
        .collect();
    let mut worst = ChangeError {
        error: 0.0,
        rank: 0,
        tensor: 0,
    };
    for (rank, tensors) in replicas.iter().enumerate() {
        assert_eq!(tensors.len(), reference.len(), "{what}: replica {rank}");
        for (tensor, (got, want)) in tensors.iter().zip(reference).enumerate() {
            assert_eq!(
                got.len(),
                want.len(),
                "{what}: replica {rank}, tensor {tensor}"
            );
            let error = max_abs_difference(got, want) / scales[tensor];
            if error.is_nan() || error > worst.error {
                worst = ChangeError {
                    error,
                    rank,
                    tensor,
                };
            }
        }
    }
    worst
}

/// The largest |a − b|; NaN if any difference is NaN.
fn max_abs_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() || d > m { d } else { m }
    })
}

/// Asserts that every replica moved from the reference's start like the reference did, to
/// `tolerance` (relative, see the module docs). The reference must come from
/// [`single_with`] (or a helper over it), which records its start.
pub(crate) fn assert_close(
    replicas: &[Vec<Vec<f32>>],
    reference: &[Vec<f32>],
    tolerance: f32,
    what: &str,
) {
    let start = start_of(reference)
        .unwrap_or_else(|| panic!("{what}: the reference was not trained by `single_with`"));
    assert_close_from(replicas, reference, &start, tolerance, what);
}

/// [`assert_close`] with the common start given.
pub(crate) fn assert_close_from(
    replicas: &[Vec<Vec<f32>>],
    reference: &[Vec<f32>],
    start: &[Vec<f32>],
    tolerance: f32,
    what: &str,
) {
    let worst = change_error(replicas, reference, start, what);
    assert!(
        worst.error <= tolerance,
        "{what}: replica {}, tensor {}: relative error of the change {:e} > {tolerance:e}",
        worst.rank,
        worst.tensor,
        worst.error
    );
}
