//! The comparison: per tensor, max |got − want| over max |want − start|, where `start` is
//! the common initial model, and the worst over tensors. (Taken relative to the parameters
//! themselves, a wrong update hides inside the tolerance after a few small steps.) Tensors
//! that do not train are compared relative to their values instead, see [`STILL`].

use std::collections::{BTreeMap, HashMap};

/// A reference tensor whose largest change is below this fraction of its largest value only
/// moved by rounding (its exact gradient is zero, e.g. a convolution's bias ahead of batch
/// norm), so its change is noise: it is compared relative to its values instead. (In kiln's
/// tests, tensors that train move by 1 % of their values or more, ResNet-18's included;
/// rounding moves the others by under 3e-7 of theirs.)
pub const STILL: f32 = 1e-4;

/// A set of parameter tensors, named, in an order equal for equal sets.
pub trait Tensors {
    /// `(name, values)` of every tensor.
    fn tensors(&self) -> Vec<(String, &[f32])>;
}

/// By parameter path (sorted).
impl Tensors for HashMap<String, Vec<f32>> {
    fn tensors(&self) -> Vec<(String, &[f32])> {
        let sorted: BTreeMap<_, _> = self.iter().collect();
        sorted
            .into_iter()
            .map(|(path, values)| (path.clone(), values.as_slice()))
            .collect()
    }
}

/// Tensors in order (named by index).
impl Tensors for [Vec<f32>] {
    fn tensors(&self) -> Vec<(String, &[f32])> {
        self.iter()
            .enumerate()
            .map(|(index, values)| (format!("tensor {index}"), values.as_slice()))
            .collect()
    }
}

/// Tensors in order (named by index).
impl Tensors for Vec<Vec<f32>> {
    fn tensors(&self) -> Vec<(String, &[f32])> {
        self.as_slice().tensors()
    }
}

/// One flat tensor (a whole model's parameters end to end).
impl Tensors for [f32] {
    fn tensors(&self) -> Vec<(String, &[f32])> {
        vec![("all parameters".into(), self)]
    }
}

/// One flat tensor (a whole model's parameters end to end).
impl Tensors for Vec<f32> {
    fn tensors(&self) -> Vec<(String, &[f32])> {
        self.as_slice().tensors()
    }
}

/// Where copies moved least like the reference: the largest relative error of a change,
/// the copy and the tensor it occurred in.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeError {
    /// The relative error (NaN if a copy holds NaN).
    pub error: f32,
    /// Which of the copies.
    pub copy: usize,
    /// The tensor's name.
    pub tensor: String,
}

impl std::fmt::Display for ChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "copy {}, {}: relative error of the change {:e}",
            self.copy, self.tensor, self.error
        )
    }
}

/// How far `got` moved from `start` unlike `want` did (see the module docs).
///
/// # Panics
/// If the sets' tensors differ in number, name or length, or no tensor of `want` moved.
pub fn change_error<T: Tensors + ?Sized>(start: &T, want: &T, got: &T) -> f32 {
    worst_change(start, want, std::slice::from_ref(&got)).error
}

/// The worst [`change_error`] over `copies` (data-parallel replicas, or the copies of a
/// stage), with where it occurred.
///
/// # Panics
/// As [`change_error`].
pub fn worst_change<T: Tensors + ?Sized>(start: &T, want: &T, copies: &[&T]) -> ChangeError {
    let (start, want) = (start.tensors(), want.tensors());
    assert_eq!(
        start.len(),
        want.len(),
        "the reference vs its start: tensors"
    );
    let scales: Vec<(f32, bool)> = start
        .iter()
        .zip(&want)
        .map(|((name, from), (other, to))| {
            assert_eq!(name, other, "the reference vs its start");
            assert_eq!(from.len(), to.len(), "the reference vs its start: {name}");
            let values = to.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let change = max_abs_difference(to, from);
            if change > STILL * values {
                (change, true)
            } else {
                (values.max(1e-6), false)
            }
        })
        .collect();
    assert!(
        scales.iter().any(|&(_, moved)| moved),
        "the reference did not move"
    );
    let mut worst = ChangeError {
        error: 0.0,
        copy: 0,
        tensor: String::new(),
    };
    for (copy, got) in copies.iter().enumerate() {
        let got = got.tensors();
        assert_eq!(got.len(), want.len(), "copy {copy}: tensors");
        for ((name, got), ((other, want), (scale, _))) in got.iter().zip(want.iter().zip(&scales)) {
            assert_eq!(name, other, "copy {copy}");
            assert_eq!(got.len(), want.len(), "copy {copy}: {name}");
            let error = max_abs_difference(got, want) / scale;
            if error.is_nan() || error > worst.error || worst.tensor.is_empty() {
                worst = ChangeError {
                    error,
                    copy,
                    tensor: name.clone(),
                };
            }
        }
    }
    worst
}

/// The largest |a − b| relative to `b`'s largest magnitude (outputs of two kernels; NaN if
/// a difference is NaN).
///
/// # Panics
/// If the lengths differ.
pub fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared values");
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-12);
    max_abs_difference(a, b) / scale
}

/// The largest |a − b|; NaN if any difference is NaN.
fn max_abs_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() || d > m { d } else { m }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_tensor_and_copy_are_named_and_still_tensors_compare_to_their_values() {
        let start = vec![vec![1.0, 1.0], vec![3.0, 3.0]];
        // The second tensor does not train (moved by 1e-7 of its values).
        let want = vec![vec![0.0, 2.0], vec![3.0, 3.0000003]];
        let good = vec![vec![0.0, 2.0001], vec![3.0, 3.0]];
        let bad = vec![vec![0.0, 2.0], vec![3.0, 3.3]];
        let worst = worst_change(&start, &want, &[&good, &bad]);
        assert_eq!((worst.copy, worst.tensor.as_str()), (1, "tensor 1"));
        assert!((worst.error - 0.1).abs() < 1e-4, "{worst}");
        assert!((change_error(&start, &want, &good) - 1e-4).abs() < 1e-5);
        let nan = vec![vec![0.0, f32::NAN], vec![3.0, 3.0]];
        assert!(change_error(&start, &want, &nan).is_nan());
    }

    #[test]
    #[should_panic(expected = "did not move")]
    fn a_reference_that_did_not_move_is_refused() {
        let start = vec![1.0f32, 2.0];
        change_error(&start, &start, &start);
    }
}
