//! A stage's incoming messages: activations and gradients of any micro-batch, from any
//! neighbour, taken by what they are rather than by arrival order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::runtime::PipelineError;

/// What a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Carries {
    /// A virtual stage's input activation.
    Activation,
    /// The gradient of a virtual stage's output.
    Gradient,
}

impl std::fmt::Display for Carries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Carries::Activation => "activation",
            Carries::Gradient => "gradient",
        })
    }
}

/// A tensor for virtual stage `to` of micro-batch `micro`.
pub(crate) struct Message<H> {
    pub carries: Carries,
    pub micro: usize,
    pub to: usize,
    pub value: H,
}

/// Raised by whoever fails first (a stage or the driver), so that every waiting party stops
/// within one [`Abort::POLL`] instead of at its timeout.
#[derive(Debug, Clone, Default)]
pub(crate) struct Abort(Arc<AtomicBool>);

impl Abort {
    /// How often a wait looks at the flag.
    const POLL: Duration = Duration::from_millis(20);

    pub(crate) fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// The flag itself, for waits outside this crate (a checkpoint's parts).
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }

    fn raised(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Receives from `channel` within `timeout`, unless the flag goes up first.
    pub(crate) fn recv<T>(
        &self,
        channel: &Receiver<T>,
        timeout: Duration,
    ) -> Result<T, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.raised() {
                return Err(RecvTimeoutError::Disconnected);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RecvTimeoutError::Timeout);
            }
            match channel.recv_timeout(left.min(Self::POLL)) {
                Err(RecvTimeoutError::Timeout) => continue,
                other => return other,
            }
        }
    }
}

/// Receives messages, holding those that arrive before they are asked for.
pub(crate) struct Mailbox<H> {
    stage: usize,
    inbox: Receiver<Message<H>>,
    held: HashMap<(Carries, usize, usize), H>,
    timeout: Duration,
    abort: Abort,
}

impl<H> Mailbox<H> {
    pub(crate) fn new(
        stage: usize,
        inbox: Receiver<Message<H>>,
        timeout: Duration,
        abort: Abort,
    ) -> Self {
        Self {
            stage,
            inbox,
            held: HashMap::new(),
            timeout,
            abort,
        }
    }

    /// The `carries` of micro-batch `micro` for virtual stage `to`, waiting at most the
    /// timeout.
    pub(crate) fn take(
        &mut self,
        carries: Carries,
        micro: usize,
        to: usize,
    ) -> Result<H, PipelineError> {
        let key = (carries, micro, to);
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(value) = self.held.remove(&key) {
                return Ok(value);
            }
            let what = || format!("the {carries} of micro-batch {micro} for virtual stage {to}");
            let left = deadline.saturating_duration_since(Instant::now());
            match self.abort.recv(&self.inbox, left) {
                Ok(message) => {
                    self.held
                        .insert((message.carries, message.micro, message.to), message.value);
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(PipelineError::Timeout {
                        stage: self.stage,
                        what: what(),
                        waited: self.timeout,
                    });
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(PipelineError::PeerLost {
                        stage: self.stage,
                        what: what(),
                    });
                }
            }
        }
    }
}
