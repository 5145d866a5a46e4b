//! Messages of any length between processes, each whole: a pipeline stage's activations and
//! gradients for a stage in another process (feature `mpi`).
//!
//! A message is one MPI message of bytes under one tag; the receiver learns its length by
//! probing (`MPI_Improbe`, thread-safe matched probing), so micro-batches of any size travel.
//! Sends and probes run on the caller's thread (MPI runs with `MPI_THREAD_MULTIPLE`) as
//! non-blocking operations, so a thread waiting for a message never stalls the process's
//! collectives. MPI keeps the order of messages from one sender under one tag.
//!
//! On a group split from the world ([`MpiCommunicator::split`](crate::MpiCommunicator::split))
//! ranks are the group's: messages travel between the members' world ranks, under a tag that
//! includes the group's context, so that no other group's messages match.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::point_to_point::MatchedReceiveVec as _;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::{Destination, Source};

use crate::{CommError, Communicator};

/// A process's end of one tag's messages.
#[derive(Debug, Clone)]
pub struct MpiMessages {
    tag: i32,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// The world rank of each rank of the group.
    members: Arc<[usize]>,
}

impl MpiMessages {
    /// The messages under `tag` between the processes of `world` (an MPI communicator, one
    /// rank per process: [`MpiCommunicator::world`](crate::MpiCommunicator::world) or a group
    /// split from it; ranks are its ranks).
    ///
    /// # Errors
    /// [`CommError::Unsupported`] for another kind of communicator, or without
    /// `MPI_THREAD_MULTIPLE`.
    pub fn new(world: &Communicator, tag: u16) -> Result<Self, CommError> {
        let Communicator::Mpi(mpi) = world else {
            return Err(CommError::Unsupported {
                op: "messages",
                rank: world.rank(),
                detail: "messages between processes need the MPI world communicator (one rank per process)".into(),
            });
        };
        if !crate::mpi_p2p::thread_multiple() {
            return Err(CommError::Unsupported {
                op: "messages",
                rank: mpi.rank(),
                detail:
                    "MPI did not grant MPI_THREAD_MULTIPLE, which messages between processes need"
                        .into(),
            });
        }
        Ok(Self {
            // Clear of the tags the hybrid backend's point-to-point uses (replica pairs), and
            // of other groups' (contexts stay below `MAX_CONTEXTS`: under 2^30).
            tag: (1 << 20) + ((mpi.context() as i32) << 16) + i32::from(tag),
            rank: mpi.rank(),
            size: mpi.world_size(),
            timeout: mpi.timeout(),
            members: mpi.world_ranks().into(),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Sends `bytes` to process `to`; returns once MPI has taken them.
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] if `to` is outside the group; [`CommError::Timeout`]
    /// if the message is not taken within the timeout (the receiving process is stuck or
    /// gone).
    pub fn send(&self, to: usize, bytes: &[u8]) -> Result<(), CommError> {
        let Some(&to) = self.members.get(to) else {
            return Err(CommError::InvalidArgument {
                op: "send",
                rank: self.rank,
                detail: format!("rank {to} is outside the group of {}", self.size),
            });
        };
        let world = SimpleCommunicator::world();
        let start = Instant::now();
        mpi::request::scope(|scope| {
            let mut request = Some(
                world
                    .process_at_rank(to as i32)
                    .immediate_send_with_tag(scope, bytes, self.tag),
            );
            loop {
                match request.take().expect("pending").test() {
                    Ok(_) => return Ok(()),
                    Err(pending) => request = Some(pending),
                }
                if start.elapsed() >= self.timeout {
                    // A started send cannot be abandoned: the job ends (as every collective's
                    // timeout ends it), every rank with an error.
                    let err = CommError::Timeout {
                        op: "send",
                        rank: self.rank,
                        waited: self.timeout,
                    };
                    crate::mpi_backend::abort_job(self.rank, &err.to_string());
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    }

    /// The next message under the tag from any process of the group, if one has arrived:
    /// its sender (the group's rank) and its bytes.
    pub fn try_recv(&self) -> Option<(usize, Vec<u8>)> {
        let world = SimpleCommunicator::world();
        let probed = world
            .any_process()
            .immediate_matched_probe_with_tag(self.tag)?;
        let (bytes, status) = probed.matched_receive_vec::<u8>();
        let source = status.source_rank() as usize;
        // Only members send under the group's tag (its context is theirs alone).
        let from = self
            .members
            .iter()
            .position(|&member| member == source)
            .unwrap_or(source);
        Some((from, bytes))
    }
}
