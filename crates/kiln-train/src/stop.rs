//! Stopping a run early and cleanly: a preempted job gets SIGTERM, saves at the next step
//! boundary and exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A request to stop training after the current step, with a checkpoint (see
/// [`TrainerBuilder::stop_flag`](crate::TrainerBuilder::stop_flag)). Clones share the flag.
///
/// ```
/// use kiln_train::StopFlag;
/// let flag = StopFlag::new();
/// let seen_by_trainer = flag.clone();
/// flag.request();
/// assert!(seen_by_trainer.is_requested());
/// ```
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// A flag nobody has raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks training to stop after the current step.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// A flag raised when the process receives SIGTERM (what schedulers send a job they
    /// preempt); a second SIGTERM ends the process at once (exit status 143), for a run
    /// stuck outside the training loop. Register it before starting other threads.
    ///
    /// # Errors
    /// When the handler cannot be installed.
    #[cfg(unix)]
    pub fn on_sigterm() -> std::io::Result<Self> {
        let flag = Self::new();
        let raised = Arc::clone(&flag.0);
        // SAFETY: the action only swaps an atomic that the closure owns (an `Arc` kept alive
        // by the registry, never dropped in the handler) and may call `_exit`, which POSIX
        // lists as async-signal-safe: no allocation, lock or panic happens in the handler.
        unsafe {
            signal_hook_registry::register(libc::SIGTERM, move || {
                if raised.swap(true, Ordering::SeqCst) {
                    // SAFETY: `_exit` is async-signal-safe and ends the process at once.
                    libc::_exit(143);
                }
            })?;
        }
        Ok(flag)
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::StopFlag;

    #[test]
    fn sigterm_raises_the_flag_instead_of_ending_the_process() {
        let flag = StopFlag::on_sigterm().unwrap();
        assert!(!flag.is_requested());
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !flag.is_requested() {
            assert!(
                std::time::Instant::now() < deadline,
                "SIGTERM never arrived"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
