//! A reusable barrier with a timeout and poisoning.
//!
//! `std::sync::Barrier` cannot time out and cannot tell waiters that a peer is gone, so a
//! lost rank would hang the others forever. This one can: waiting returns an error when the
//! deadline passes or when any rank has poisoned the group.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::CommError;

/// Why the group can no longer be used.
#[derive(Debug, Clone)]
pub(crate) struct Poison {
    pub peer: usize,
    pub reason: String,
}

#[derive(Debug, Default)]
struct State {
    arrived: usize,
    generation: u64,
    poison: Option<Poison>,
}

/// The barrier shared by every rank of one group.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    world_size: usize,
    state: Mutex<State>,
    cond: Condvar,
    /// Mirrors `State::generation` so that waiters can spin without the lock.
    generation: AtomicU64,
    /// Mirrors `State::poison.is_some()`.
    poisoned: AtomicBool,
}

/// Polls of the lock-free fast path before a waiter blocks on the condition variable.
/// Waking a blocked thread costs tens of microseconds, as long as a 1 MB copy; most
/// rendezvous complete within a few microseconds when every rank is running.
const SPINS: u32 = 4096;

impl Rendezvous {
    pub fn new(world_size: usize) -> Self {
        Self {
            world_size,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            generation: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a few integers updated atomically under the lock: a panicking holder
        // cannot leave it half-written.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks the group unusable; the first poison wins. Wakes every waiter.
    pub fn poison(&self, peer: usize, reason: impl Into<String>) {
        let mut state = self.lock();
        if state.poison.is_none() {
            state.poison = Some(Poison {
                peer,
                reason: reason.into(),
            });
        }
        self.poisoned.store(true, Ordering::Release);
        self.cond.notify_all();
    }

    /// The poison, if any.
    pub fn check(&self, op: &'static str, rank: usize) -> Result<(), CommError> {
        match &self.lock().poison {
            Some(poison) => Err(lost(op, rank, poison)),
            None => Ok(()),
        }
    }

    /// Blocks until every rank has arrived, the group is poisoned, or `timeout` passes.
    ///
    /// A timeout poisons the group too: the ranks can no longer agree on which operation they
    /// are in, so every one of them must fail rather than wait.
    pub fn wait(&self, op: &'static str, rank: usize, timeout: Duration) -> Result<(), CommError> {
        let start = Instant::now();
        let mut state = self.lock();
        if let Some(poison) = &state.poison {
            return Err(lost(op, rank, poison));
        }
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.world_size {
            state.arrived = 0;
            state.generation += 1;
            self.generation.store(state.generation, Ordering::Release);
            self.cond.notify_all();
            return Ok(());
        }
        // Fast path: spin (yielding now and then, in case ranks outnumber cores) until the
        // last rank arrives, then fall back to blocking.
        drop(state);
        for spin in 0..SPINS {
            if self.generation.load(Ordering::Acquire) != generation
                || self.poisoned.load(Ordering::Acquire)
            {
                break;
            }
            if spin % 64 == 63 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let mut state = self.lock();
        loop {
            // A completed generation wins over a later poison: this rank's part is done.
            if state.generation != generation {
                return Ok(());
            }
            if let Some(poison) = &state.poison {
                return Err(lost(op, rank, poison));
            }
            let waited = start.elapsed();
            if waited >= timeout {
                state.poison = Some(Poison {
                    peer: rank,
                    reason: format!("rank {rank} timed out in `{op}` after {waited:?}"),
                });
                self.poisoned.store(true, Ordering::Release);
                self.cond.notify_all();
                return Err(CommError::Timeout { op, rank, waited });
            }
            state = self
                .cond
                .wait_timeout(state, timeout - waited)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }
}

pub(crate) fn lost(op: &'static str, rank: usize, poison: &Poison) -> CommError {
    CommError::PeerLost {
        op,
        rank,
        peer: poison.peer,
        reason: poison.reason.clone(),
    }
}
