//! Sub-communicators (`MPI_Comm_split`): the MPI thread's registry of the world and the
//! splits, a split's making (a context agreed by its members, which keeps message tags of
//! different groups apart) and its freeing when its handle drops.

use std::sync::Arc;

use mpi::collective::SystemOperation;
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use super::{MAX_CONTEXTS, MpiCommunicator};
use crate::CommError;

/// The communicators the MPI thread holds: the world first, then the splits, each at the
/// index its handles name.
pub(super) struct Registry {
    /// `None` where a split's last handle was dropped (its communicator freed).
    pub(super) comms: Vec<Option<SimpleCommunicator>>,
    /// The context the next split takes at least (see [`MpiCommunicator::split`]).
    pub(super) next_context: u32,
}

impl Registry {
    /// The communicator of a live handle.
    pub(super) fn live(&self, id: usize) -> &SimpleCommunicator {
        self.comms[id]
            .as_ref()
            .expect("a handle's communicator is freed only when the handle drops")
    }
}

impl MpiCommunicator {
    /// Splits this communicator's ranks into groups (`MPI_Comm_split`): the ranks that pass
    /// the same `color` form one group, ranked by `key` (ties by their rank here). Every rank
    /// of this communicator must call it, in the same order as its other collectives. The
    /// new communicator shares this process's MPI thread and timeout; this one stays usable.
    ///
    /// ```text
    /// // 4 ranks as 2 pipelines x 2 stages (rank = pipeline * 2 + stage):
    /// let copies = world.split(rank % 2, rank / 2)?;   // the copies of one stage
    /// let pipeline = world.split(rank / 2, rank % 2)?; // the stages of one pipeline
    /// ```
    ///
    /// # Errors
    /// [`CommError::InvalidArgument`] if `color` or `key` exceeds `i32::MAX` (MPI's range);
    /// [`CommError::Unsupported`] after [`MAX_CONTEXTS`] splits in this process;
    /// [`CommError::PeerLost`] if the MPI thread has stopped. A rank that never calls it
    /// makes the others time out, which aborts the job.
    pub fn split(&self, color: usize, key: usize) -> Result<crate::Communicator, CommError> {
        let (Ok(color), Ok(key)) = (i32::try_from(color), i32::try_from(key)) else {
            return Err(self.invalid(
                "split",
                format!("color {color} and key {key} must be at most {}", i32::MAX),
            ));
        };
        let id = self.id;
        let (rank, size, new_id, context, members) =
            self.call_registry("split", move |registry| {
                // A context no member uses yet: the largest any member of the parent would take.
                let mut context = 0u32;
                registry.live(id).all_reduce_into(
                    &registry.next_context,
                    &mut context,
                    SystemOperation::max(),
                );
                registry.next_context = context + 1;
                let parent = registry.live(id);
                let world_rank = registry.live(0).rank();
                let sub = parent
                    .split_by_color_with_key(Color::with_value(color), key)
                    .expect("a defined color always yields a communicator");
                let mut members = vec![0i32; sub.size() as usize];
                sub.all_gather_into(&world_rank, &mut members[..]);
                let (rank, size) = (sub.rank() as usize, sub.size() as usize);
                registry.comms.push(Some(sub));
                let members: Vec<usize> = members.into_iter().map(|r| r as usize).collect();
                (rank, size, registry.comms.len() - 1, context, members)
            })?;
        if context >= MAX_CONTEXTS {
            return Err(CommError::Unsupported {
                op: "split",
                rank: self.rank,
                detail: format!(
                    "a process may split at most {} communicators (their message tags must \
                     stay apart)",
                    MAX_CONTEXTS - 1
                ),
            });
        }
        Ok(crate::Communicator::Mpi(Self {
            rank,
            world_size: size,
            timeout: self.timeout,
            id: new_id,
            context,
            members: members.into(),
            thread: Arc::clone(&self.thread),
        }))
    }

    /// The world rank of each rank of this communicator (the identity for the world).
    pub fn world_ranks(&self) -> &[usize] {
        &self.members
    }

    /// This communicator's context: 0 for the world, agreed by every member of a split and
    /// unique among the communicators of this process.
    pub(crate) fn context(&self) -> u32 {
        self.context
    }

    /// The communicators this process's MPI thread holds: the world and every split whose
    /// handle is alive (a dropped split's communicator is freed).
    ///
    /// # Errors
    /// [`CommError::PeerLost`] if the MPI thread stopped.
    pub fn communicators_held(&self) -> Result<usize, CommError> {
        self.call_registry("communicators_held", |registry| {
            registry.comms.iter().flatten().count()
        })
    }
}

impl Drop for MpiCommunicator {
    /// A split's handle frees its communicator (`MPI_Comm_free`, on the MPI thread, after
    /// the operations submitted before it); the world stays until the last handle goes.
    fn drop(&mut self) {
        if self.id == 0 {
            return;
        }
        let id = self.id;
        if let Some(jobs) = &self.thread.jobs {
            let _ = jobs.send(Box::new(move |registry: &mut Registry| {
                registry.comms[id] = None;
            }));
        }
    }
}
