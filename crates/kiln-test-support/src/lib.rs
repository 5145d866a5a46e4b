//! What kiln's equivalence tests share (a dev-dependency of every crate that trains in
//! parallel, and of the example's `selftest`).
//!
//! Every parallel feature is tested against single-device f32 training on the parameter
//! *changes*: [`change_error`] is the one metric, the [`tolerance`]s are named and their
//! measurements stated once, and a control run that must miss each one sits in the test.
//!
//! ```
//! use std::collections::HashMap;
//! use kiln_test_support::{change_error, tolerance};
//!
//! let start = HashMap::from([("w".to_string(), vec![1.0f32, 2.0])]);
//! let want = HashMap::from([("w".to_string(), vec![0.5f32, 2.5])]);
//! let got = HashMap::from([("w".to_string(), vec![0.5f32, 2.5000002])]);
//! assert!(change_error(&start, &want, &got) <= tolerance::REORDERED);
//! let wrong = HashMap::from([("w".to_string(), vec![0.6f32, 2.5])]);
//! assert!(change_error(&start, &want, &wrong) > tolerance::HALF_PRECISION);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod compare;
pub mod tolerance;

pub use compare::{ChangeError, STILL, Tensors, change_error, relative_error, worst_change};
