//! A communication thread: collectives that run while the caller keeps computing.
//!
//! [`CommWorker`] owns a rank's [`Communicator`] on a thread of its own and runs submitted
//! operations in submission order, so every rank issues the same sequence of collectives.
//! [`CommWorker::submit`] returns a [`Pending`] result that must be waited on (the shape of
//! Burn's `CollectiveTensor::resolve`); meanwhile the caller computes. This is how
//! data-parallel training overlaps gradient all-reduce with backward.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::{CommError, Communicator};

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
    /// Blocks until the operation has run. The operation itself is bounded by the group's
    /// timeout, so this cannot wait forever.
    pub fn wait(self) -> Result<Timed<T>, CommError> {
        self.result.recv().unwrap_or_else(|_| {
            Err(CommError::PeerLost {
                op: "wait",
                rank: self.rank,
                peer: self.rank,
                reason: "the communication thread stopped (a collective panicked)".into(),
            })
        })
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

    /// A handle that aborts the group from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Queues `op` to run on the communication thread after everything submitted before it.
    pub fn submit<T, F>(&self, op: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&Communicator) -> Result<T, CommError> + Send + 'static,
    {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let job: Job = Box::new(move |comm| {
            let start = Instant::now();
            let result = op(comm).map(|value| Timed {
                value,
                busy: start.elapsed(),
            });
            let _ = tx.send(result);
        });
        if let Some(jobs) = &self.jobs {
            // If the thread is gone the job is dropped with its sender and `wait` reports it.
            let _ = jobs.send(job);
        }
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
}

impl Drop for CommWorker {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}
