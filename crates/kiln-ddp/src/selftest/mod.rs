//! kiln's data-parallel and mixed-precision equivalence checks, run on a user's own devices:
//! [`SelfTest`].

mod checks;
mod probe;
mod report;

#[cfg(test)]
mod tests;

pub use checks::SelfTest;
pub use report::{SelfTestCheck, SelfTestReport};
