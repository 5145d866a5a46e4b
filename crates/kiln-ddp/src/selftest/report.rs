//! What a self-test found: a line per check and whether all passed.

use std::fmt;
use std::time::Duration;

/// One check of a [`SelfTest`](super::SelfTest): what it compared and how it came out.
#[derive(Debug, Clone, PartialEq)]
pub struct SelfTestCheck {
    /// What was compared (precision, replicas, gradient path, or the control).
    pub name: String,
    /// `Ok` with the measured error against its tolerance, or `Err` with why it failed.
    pub outcome: Result<String, String>,
}

/// Every check of a [`SelfTest`](super::SelfTest) run, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct SelfTestReport {
    /// The checks.
    pub checks: Vec<SelfTestCheck>,
    /// How long they took, device start-up and kernel compilation included.
    pub elapsed: Duration,
}

impl SelfTestReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|check| check.outcome.is_ok())
    }
}

/// A line per check (`selftest: ok    …` or `selftest: FAIL  …`), then the verdict.
impl fmt::Display for SelfTestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            match &check.outcome {
                Ok(detail) => writeln!(f, "selftest: ok    {}: {detail}", check.name)?,
                Err(detail) => writeln!(f, "selftest: FAIL  {}: {detail}", check.name)?,
            }
        }
        write!(
            f,
            "selftest: {} in {:.1} s",
            if self.passed() { "passed" } else { "FAILED" },
            self.elapsed.as_secs_f64()
        )
    }
}
