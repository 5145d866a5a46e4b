//! Reporting a thread that panicked.

use std::any::Any;

/// The message of a caught panic (`panic!` with a literal or a formatted message), for the
/// error that reports a failed replica or stage thread.
///
/// ```
/// let caught = std::panic::catch_unwind(|| panic!("stage {} failed", 3)).unwrap_err();
/// assert_eq!(kiln_core::panic_message(&*caught), "stage 3 failed");
/// ```
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}
