//! The backend-independent communicator.

use std::time::Duration;

use crate::{CommElement, CommError, InProcessCommunicator, ReduceBuffer, ReduceOp};

/// One rank's handle on a communication group, whatever the backend.
///
/// A communicator is `Send` (move it to the thread that owns the rank) but is used from one
/// thread at a time. Every method blocks until its part of the operation is done and fails,
/// rather than hangs, when a peer is gone or the timeout passes.
#[derive(Debug)]
pub enum Communicator {
    /// A rank of an in-process (threads) group.
    InProcess(InProcessCommunicator),
    /// This process's rank of the MPI world (feature `mpi`).
    #[cfg(feature = "mpi")]
    Mpi(crate::MpiCommunicator),
    /// One of several replicas of a process in an MPI world (feature `mpi`).
    #[cfg(feature = "mpi")]
    Hybrid(crate::HybridCommunicator),
}

macro_rules! dispatch {
    ($self:ident, $comm:ident => $call:expr) => {
        match $self {
            Communicator::InProcess($comm) => $call,
            #[cfg(feature = "mpi")]
            Communicator::Mpi($comm) => $call,
            #[cfg(feature = "mpi")]
            Communicator::Hybrid($comm) => $call,
        }
    };
}

impl Communicator {
    /// This process's rank of the MPI world (`MpiCommunicator::world`'s),
    /// in any build: without the `mpi` feature it fails with [`CommError::Startup`] saying so,
    /// so a program that offers MPI as an option needs no `cfg` of its own.
    ///
    /// # Errors
    /// [`CommError::Startup`] if MPI does not start, or kiln was built without `mpi`.
    pub fn mpi_world(timeout: Duration) -> Result<Self, CommError> {
        #[cfg(feature = "mpi")]
        return crate::MpiCommunicator::world(timeout);
        #[cfg(not(feature = "mpi"))]
        {
            let _ = timeout;
            Err(CommError::Startup(
                "MPI: kiln was built without its `mpi` feature (build with `--features mpi`)"
                    .into(),
            ))
        }
    }

    /// This rank's index in `0..world_size()`.
    pub fn rank(&self) -> usize {
        dispatch!(self, c => c.rank())
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        dispatch!(self, c => c.world_size())
    }

    /// The timeout of every blocking operation.
    pub fn timeout(&self) -> Duration {
        dispatch!(self, c => c.timeout())
    }

    /// Reduces `data` element-wise over all ranks, in place.
    pub fn all_reduce<T: CommElement>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        dispatch!(self, c => c.all_reduce(data, op))
    }

    /// Reduces a [`ReduceBuffer`] element-wise over all ranks, in place, without staging
    /// copies (the fastest all-reduce of the in-process backend). Backends that cross
    /// processes gain nothing from the layout and reduce a flat copy.
    ///
    /// On an error `buffer` holds its original values.
    pub fn all_reduce_buffer(
        &self,
        buffer: &mut ReduceBuffer,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        match self {
            Communicator::InProcess(c) => c.all_reduce_buffer(buffer, op),
            #[cfg(feature = "mpi")]
            _ => {
                let mut flat = buffer.to_vec();
                self.all_reduce(&mut flat, op)?;
                buffer.copy_from(&flat);
                Ok(())
            }
        }
    }

    /// Reduces `f32` values over all ranks, in place, combining them in rank order (rank 0's,
    /// then 1's, …) wherever the ranks are: the in-process backend always does, MPI does it
    /// here instead of its own order
    /// ([`MpiCommunicator::all_reduce_in_rank_order`](crate::MpiCommunicator::all_reduce_in_rank_order)),
    /// so a run across processes adds exactly like the same run in one process. The hybrid
    /// backend adds each process's replicas first (its plain [`all_reduce`](Self::all_reduce)).
    pub fn all_reduce_in_rank_order(
        &self,
        data: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        match self {
            Communicator::InProcess(c) => c.all_reduce(data, op),
            #[cfg(feature = "mpi")]
            Communicator::Mpi(c) => c.all_reduce_in_rank_order(data, op),
            #[cfg(feature = "mpi")]
            Communicator::Hybrid(c) => c.all_reduce(data, op),
        }
    }

    /// Copies `root`'s `data` into every rank's `data`.
    pub fn broadcast<T: CommElement>(&self, data: &mut [T], root: usize) -> Result<(), CommError> {
        dispatch!(self, c => c.broadcast(data, root))
    }

    /// Concatenates every rank's `input` in rank order into `output`
    /// (`output.len() == world_size × input.len()`).
    pub fn all_gather<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), CommError> {
        dispatch!(self, c => c.all_gather(input, output))
    }

    /// Reduces `input` over all ranks; rank `r` receives part `r` of `world_size` equal parts
    /// (`input.len() == world_size × output.len()`).
    pub fn reduce_scatter<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        dispatch!(self, c => c.reduce_scatter(input, output, op))
    }

    /// Blocks until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<(), CommError> {
        dispatch!(self, c => c.barrier())
    }

    /// Sends `data` to rank `dst`.
    pub fn send<T: CommElement>(&self, data: &[T], dst: usize) -> Result<(), CommError> {
        dispatch!(self, c => c.send(data, dst))
    }

    /// Receives from rank `src` into `data` (lengths must match what was sent).
    pub fn recv<T: CommElement>(&self, data: &mut [T], src: usize) -> Result<(), CommError> {
        dispatch!(self, c => c.recv(data, src))
    }

    /// Splits the group into sub-groups: the ranks passing the same `color` form one, ranked
    /// by `key` (ties by their rank here). Every rank must call it, in the same order as its
    /// other collectives. Across processes this is `MPI_Comm_split`
    /// ([`MpiCommunicator::split`](crate::MpiCommunicator::split)); a pipeline of D × P
    /// processes splits into its stage groups (the copies of one stage, which all-reduce
    /// their gradients) and its pipelines (whose stages exchange activations).
    ///
    /// # Errors
    /// [`CommError::Unsupported`] for in-process and hybrid groups (build the sub-groups
    /// there directly with [`InProcessGroup`](crate::InProcessGroup)); see
    /// [`MpiCommunicator::split`](crate::MpiCommunicator::split) for MPI's.
    pub fn split(&self, color: usize, key: usize) -> Result<Communicator, CommError> {
        let _ = (color, key);
        let unsupported = |rank| CommError::Unsupported {
            op: "split",
            rank,
            detail: "only MPI communicators split; in one process build each sub-group as an \
                     InProcessGroup of its own"
                .into(),
        };
        match self {
            Communicator::InProcess(c) => Err(unsupported(c.rank())),
            #[cfg(feature = "mpi")]
            Communicator::Mpi(c) => c.split(color, key),
            #[cfg(feature = "mpi")]
            Communicator::Hybrid(c) => Err(unsupported(c.rank())),
        }
    }

    /// Makes every pending and later operation of the group fail with `reason`.
    pub fn abort(&self, reason: impl Into<String>) {
        dispatch!(self, c => c.abort(reason))
    }

    pub(crate) fn abort_target(&self) -> AbortTarget {
        match self {
            Communicator::InProcess(c) => AbortTarget::InProcess(c.shared()),
            #[cfg(feature = "mpi")]
            Communicator::Mpi(_) => AbortTarget::Mpi,
            #[cfg(feature = "mpi")]
            Communicator::Hybrid(c) => AbortTarget::Hybrid(c.local_shared()),
        }
    }
}

/// What an [`AbortHandle`](crate::AbortHandle) poisons.
#[derive(Debug, Clone)]
pub(crate) enum AbortTarget {
    InProcess(std::sync::Arc<crate::in_process::Shared>),
    #[cfg(feature = "mpi")]
    Mpi,
    #[cfg(feature = "mpi")]
    Hybrid(std::sync::Arc<crate::in_process::Shared>),
}

impl AbortTarget {
    pub(crate) fn abort(&self, rank: usize, reason: String) {
        match self {
            AbortTarget::InProcess(shared) => shared.rendezvous.poison(rank, reason),
            #[cfg(feature = "mpi")]
            AbortTarget::Mpi => crate::mpi_backend::abort_job(rank, &reason),
            #[cfg(feature = "mpi")]
            AbortTarget::Hybrid(shared) => {
                shared.rendezvous.poison(rank, reason.clone());
                crate::mpi_backend::abort_job(rank, &reason)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{CommError, InProcessGroup};

    /// In one process sub-groups are built directly: `split` says so instead of guessing.
    #[test]
    fn in_process_split_is_refused_with_the_alternative() {
        let comms = InProcessGroup::new(2).build();
        let err = comms[1].split(0, 0).unwrap_err();
        assert!(
            matches!(&err, CommError::Unsupported { op: "split", rank: 1, detail } if detail.contains("InProcessGroup")),
            "{err}"
        );
    }

    /// A build without MPI says so when a program asks for the MPI world.
    #[cfg(not(feature = "mpi"))]
    #[test]
    fn the_mpi_world_without_the_feature_is_an_error_naming_it() {
        let err = crate::Communicator::mpi_world(std::time::Duration::from_secs(1)).unwrap_err();
        assert!(
            matches!(&err, CommError::Startup(why) if why.contains("`mpi` feature")),
            "{err}"
        );
    }

    /// In-process all-reduce is already in rank order: the ordered form gives the same bits.
    #[test]
    fn in_process_rank_order_all_reduce_matches_all_reduce() {
        let values =
            |rank: usize| -> Vec<f32> { (0..7).map(|i| (i + rank) as f32 / 3.0).collect() };
        let results: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = InProcessGroup::new(3)
                .build()
                .into_iter()
                .map(|comm| {
                    scope.spawn(move || {
                        let (mut plain, mut ordered) = (values(comm.rank()), values(comm.rank()));
                        comm.all_reduce(&mut plain, crate::ReduceOp::Sum).unwrap();
                        comm.all_reduce_in_rank_order(&mut ordered, crate::ReduceOp::Sum)
                            .unwrap();
                        (plain, ordered)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (plain, ordered) in results {
            assert_eq!(plain, ordered);
        }
    }
}
