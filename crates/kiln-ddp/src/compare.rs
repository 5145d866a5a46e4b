//! Comparing replicas with the single-device reference (see `test_support`): the shared
//! metric of `kiln_test_support` (per tensor, the relative error of the *changes* from the
//! common start) with the replica it occurred in; its tolerances are named there
//! (`REORDERED` for f32, `COMPRESSED`, `HALF_PRECISION`). The controls in `tests.rs` and
//! `precision_tests.rs` show that wrong updates exceed them.

pub(crate) use kiln_test_support::ChangeError;
pub(crate) use kiln_test_support::tolerance::{COMPRESSED, HALF_PRECISION, REORDERED};

use crate::test_support::start_of;

/// The worst relative error of the replicas' parameter changes against the reference's,
/// all starting from `start`. Panics if no tensor of the reference moved, or if the shapes
/// disagree.
pub(crate) fn change_error(
    replicas: &[Vec<Vec<f32>>],
    reference: &[Vec<f32>],
    start: &[Vec<f32>],
    what: &str,
) -> ChangeError {
    assert_eq!(reference.len(), start.len(), "{what}: reference vs start");
    let copies: Vec<&[Vec<f32>]> = replicas.iter().map(Vec::as_slice).collect();
    kiln_test_support::worst_change(start, reference, &copies)
}

/// Asserts that every replica moved from the reference's start like the reference did, to
/// `tolerance` (relative, see the module docs). The reference must come from
/// [`single_with`](crate::test_support::single_with) (or a helper over it), which records
/// its start.
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
        "{what}: replica {worst} > {tolerance:e}"
    );
}
