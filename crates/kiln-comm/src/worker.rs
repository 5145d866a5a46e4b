//! A communication thread: collectives that run while the caller keeps computing.
//!
//! [`CommWorker`] owns a rank's [`Communicator`] on a thread of its own and runs submitted
//! operations in submission order, so every rank issues the same sequence of collectives.
//! [`CommWorker::submit`] returns a [`Pending`] result that must be waited on (the shape of
//! Burn's `CollectiveTensor::resolve`); meanwhile the caller computes. This is how
//! data-parallel training overlaps gradient all-reduce with backward.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::{CommError, Communicator, ReduceOp};

type Job = Box<dyn FnOnce(&Communicator) + Send>;

/// A rank's communicator, driven from a dedicated thread.
///
/// ```
/// use kiln_comm::{CommWorker, InProcessGroup, ReduceOp};
///
/// let workers: Vec<CommWorker> = InProcessGroup::new(2).build().into_iter().map(CommWorker::spawn).collect();
/// let pending: Vec<_> = workers
///     .iter()
///     .map(|w| w.submit(|comm| {
///         let mut data = vec![1.0f32; 3];
///         comm.all_reduce(&mut data, ReduceOp::Sum).map(|_| data)
///     }))
///     .collect();
/// for p in pending {
///     assert_eq!(p.wait().unwrap().value, vec![2.0; 3]);
/// }
/// ```
#[derive(Debug)]
pub struct CommWorker {
    rank: usize,
    world_size: usize,
    jobs: Option<Sender<Job>>,
    handle: Option<JoinHandle<()>>,
    abort: AbortHandle,
    /// Operations submitted so far.
    submitted: AtomicUsize,
}

/// Fails the group's pending and later operations from any thread (see [`Communicator::abort`]).
#[derive(Debug, Clone)]
pub struct AbortHandle {
    rank: usize,
    inner: crate::communicator::AbortTarget,
}

impl AbortHandle {
    /// Poisons the group: every rank's pending and next operation fails with `reason`.
    pub fn abort(&self, reason: impl Into<String>) {
        self.inner.abort(self.rank, reason.into());
    }
}

/// The outcome of a submitted operation and how long the communication thread spent on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed<T> {
    /// What the operation returned.
    pub value: T,
    /// Time spent running it on the communication thread.
    pub busy: Duration,
}

/// A submitted operation's result, to be waited on.
#[must_use = "a pending collective must be waited on"]
#[derive(Debug)]
pub struct Pending<T> {
    rank: usize,
    result: Receiver<Result<Timed<T>, CommError>>,
}

impl<T> Pending<T> {
    /// Blocks until the operation has run or failed.
    ///
    /// Operations run one at a time, so this waits for everything submitted before it too.
    /// Each communicator call in them fails after the group's timeout rather than hanging, so
    /// operations made of communicator calls end in bounded time; a submitted closure that
    /// blocks on something else (a lock, a channel, a loop) holds this wait up as long as it
    /// does. If the communication thread has stopped (an operation panicked), this returns
    /// [`CommError::PeerLost`] at once.
    pub fn wait(self) -> Result<Timed<T>, CommError> {
        self.result
            .recv()
            .unwrap_or_else(|_| Err(thread_stopped(self.rank)))
    }
}

/// The error of an operation that cannot run because the communication thread has stopped.
fn thread_stopped(rank: usize) -> CommError {
    CommError::PeerLost {
        op: "submit",
        rank,
        peer: rank,
        reason: format!(
            "the communication thread of rank {rank} has stopped (an operation submitted to \
             it panicked)"
        ),
    }
}

impl CommWorker {
    /// Moves `comm` to a new communication thread.
    pub fn spawn(comm: Communicator) -> Self {
        let (rank, world_size) = (comm.rank(), comm.world_size());
        let abort = AbortHandle {
            rank,
            inner: comm.abort_target(),
        };
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let handle = std::thread::Builder::new()
            .name(format!("kiln-comm-{rank}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job(&comm);
                }
            })
            .expect("failed to spawn the communication thread");
        Self {
            rank,
            world_size,
            jobs: Some(tx),
            handle: Some(handle),
            abort,
            submitted: AtomicUsize::new(0),
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// How many operations were submitted to this rank's thread so far (every collective of
    /// a data-parallel step goes through it; Burn's native device collectives do not).
    pub fn operations(&self) -> usize {
        self.submitted.load(Ordering::Relaxed)
    }

    /// A handle that aborts the group from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Queues `op` to run on the communication thread after everything submitted before it.
    ///
    /// If the thread has stopped (an earlier operation panicked), `op` never runs and the
    /// [`Pending`] holds [`CommError::PeerLost`].
    pub fn submit<T, F>(&self, op: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&Communicator) -> Result<T, CommError> + Send + 'static,
    {
        self.submitted.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let reply = tx.clone();
        let job: Job = Box::new(move |comm| {
            let start = Instant::now();
            let result = op(comm).map(|value| Timed {
                value,
                busy: start.elapsed(),
            });
            let _ = tx.send(result);
        });
        // The thread is gone once an operation panicked: answer the job here instead. (A job
        // queued just before the thread stops is dropped with the queue; `wait` sees its
        // reply channel close and reports the same error.)
        let queued = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok());
        if !queued {
            let _ = reply.send(Err(thread_stopped(self.rank)));
        }
        drop(reply);
        Pending {
            rank: self.rank,
            result: rx,
        }
    }

    /// Runs `op` on the communication thread and waits for it.
    pub fn run<T, F>(&self, op: F) -> Result<T, CommError>
    where
        T: Send + 'static,
        F: FnOnce(&Communicator) -> Result<T, CommError> + Send + 'static,
    {
        self.submit(op).wait().map(|timed| timed.value)
    }

    /// All-reduces `values` with `op` on the communication thread and waits for the result
    /// (small reductions: counts, flags, statistics).
    pub fn all_reduce_values(&self, values: Vec<f32>, op: ReduceOp) -> Result<Vec<f32>, CommError> {
        self.run(move |c| {
            let mut values = values;
            c.all_reduce(&mut values, op).map(|_| values)
        })
    }
}

impl Drop for CommWorker {
    fn drop(&mut self) {
        self.jobs.take();
        // While a replica's panic unwinds, the communication thread may be stuck in a
        // collective its peers will never finish (MPI cannot cancel one): waiting for it here
        // would keep the replica from reporting its failure, and the job from being aborted.
        if std::thread::panicking() {
            return;
        }
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::CommWorker;
    use crate::{CommError, InProcessGroup};

    fn thread_stopped(result: &Result<impl std::fmt::Debug, CommError>) -> bool {
        matches!(result, Err(CommError::PeerLost { reason, .. }) if reason.contains("stopped"))
    }

    /// After an operation panics, the one queued behind it and every later one fail with an
    /// error instead of hanging, and none of them runs.
    #[test]
    fn operations_after_the_thread_stopped_fail_instead_of_hanging() {
        let start = Instant::now();
        let worker = CommWorker::spawn(InProcessGroup::new(1).build().pop().unwrap());
        let (release, gate) = crossbeam_channel::bounded::<()>(0);
        let panicking = worker.submit(move |_| -> Result<(), CommError> {
            let _ = gate.recv();
            panic!("planted failure");
        });
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let queued = worker.submit(move |_| {
            flag.store(true, Ordering::SeqCst);
            Ok(())
        });
        drop(release); // lets the first operation panic
        assert!(thread_stopped(&panicking.wait()));
        assert!(thread_stopped(&queued.wait()));
        for _ in 0..3 {
            let flag = Arc::clone(&ran);
            let later = worker.run(move |_| {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            });
            assert!(thread_stopped(&later), "{later:?}");
        }
        assert!(
            !ran.load(Ordering::SeqCst),
            "no operation runs after the panic"
        );
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}
