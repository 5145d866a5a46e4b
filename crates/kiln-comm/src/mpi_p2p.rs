//! Point-to-point between replicas of different processes (the hybrid backend).
//!
//! The MPI thread runs a process's collectives one after another, so a receive parked there
//! would stall every collective of every local replica behind it. Cross-process messages
//! therefore travel on the calling replica's own thread (MPI runs with
//! `MPI_THREAD_MULTIPLE`), as non-blocking MPI operations polled against the deadline. The
//! tag names the (sending, receiving) local replicas; MPI's source rank names the process.
//!
//! A started MPI request cannot be abandoned safely (a send may not be cancellable), so a
//! timeout or a failed local replica aborts the whole job, as the MPI backend does for
//! collectives: every rank is ended by the launcher instead of waiting forever.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mpi::datatype::Equivalence as _;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::{Destination, Source};

use crate::mpi_backend::abort_job;
use crate::{CommError, InProcessCommunicator};

/// Whether MPI granted `MPI_THREAD_MULTIPLE` (set once, when MPI is initialised).
static THREAD_MULTIPLE: OnceLock<bool> = OnceLock::new();

/// Records the threading level MPI granted.
pub(crate) fn set_thread_multiple(granted: bool) {
    let _ = THREAD_MULTIPLE.set(granted);
}

/// Whether MPI granted `MPI_THREAD_MULTIPLE` (false before MPI is initialised).
pub(crate) fn thread_multiple() -> bool {
    THREAD_MULTIPLE.get().copied().unwrap_or(false)
}

/// What one cross-process message needs to know about its replica.
pub(crate) struct Endpoint<'a> {
    /// The global rank of the calling replica (for errors).
    pub rank: usize,
    /// How long to wait.
    pub timeout: Duration,
    /// The process's local group: once it fails (a replica of this process is gone), so
    /// does the wait.
    pub local: &'a InProcessCommunicator,
}

impl Endpoint<'_> {
    fn require_threads(&self, op: &'static str) -> Result<(), CommError> {
        if THREAD_MULTIPLE.get().copied().unwrap_or(false) {
            Ok(())
        } else {
            Err(CommError::Unsupported {
                op,
                rank: self.rank,
                detail: "MPI did not grant MPI_THREAD_MULTIPLE, which point-to-point between \
                         replicas of different processes needs"
                    .into(),
            })
        }
    }

    /// Polls `test` until it completes; aborts the job on a timeout or a lost local replica.
    fn poll<R>(&self, op: &'static str, mut test: impl FnMut() -> Option<R>) -> R {
        let start = Instant::now();
        loop {
            if let Some(done) = test() {
                return done;
            }
            if let Err(err) = self.local.check_alive() {
                abort_job(self.rank, &err.to_string());
            }
            if start.elapsed() >= self.timeout {
                let err = CommError::Timeout {
                    op,
                    rank: self.rank,
                    waited: self.timeout,
                };
                abort_job(self.rank, &err.to_string());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Sends `data` to MPI rank `process` with `tag`; returns once MPI has taken the message.
pub(crate) fn send(
    endpoint: &Endpoint<'_>,
    data: &[f32],
    process: usize,
    tag: i32,
) -> Result<(), CommError> {
    endpoint.require_threads("send")?;
    let world = SimpleCommunicator::world();
    mpi::request::scope(|scope| {
        let mut request = Some(
            world
                .process_at_rank(process as i32)
                .immediate_send_with_tag(scope, data, tag),
        );
        endpoint.poll("send", || match request.take()?.test() {
            Ok(_) => Some(()),
            Err(pending) => {
                request = Some(pending);
                None
            }
        });
    });
    Ok(())
}

/// Receives exactly `len` values from MPI rank `process` with `tag`.
pub(crate) fn recv(
    endpoint: &Endpoint<'_>,
    len: usize,
    process: usize,
    tag: i32,
) -> Result<Vec<f32>, CommError> {
    endpoint.require_threads("recv")?;
    let world = SimpleCommunicator::world();
    let mut out = vec![0.0f32; len];
    let count = mpi::request::scope(|scope| {
        let mut request = Some(
            world
                .process_at_rank(process as i32)
                .immediate_receive_into_with_tag(scope, &mut out[..], tag),
        );
        endpoint.poll("recv", || match request.take()?.test() {
            Ok(status) => Some(status.count(f32::equivalent_datatype()) as usize),
            Err(pending) => {
                request = Some(pending);
                None
            }
        })
    });
    if count != len {
        return Err(CommError::InvalidArgument {
            op: "recv",
            rank: endpoint.rank,
            detail: format!("received {count} elements, expected {len}"),
        });
    }
    Ok(out)
}
