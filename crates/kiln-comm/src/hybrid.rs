//! Processes × local devices: MPI between processes, shared memory within each.
//!
//! Every process runs `local_size` replicas in threads; the global rank is
//! `process × local_size + local rank`. A collective first combines the local ranks through
//! the in-process backend, then local rank 0 of every process runs the MPI collective, then
//! the result is broadcast locally. Only local rank 0 runs MPI collectives, so MPI sees one
//! rank per process, as it expects. Point-to-point across processes is the exception: it
//! runs on the calling replica's thread (see `mpi_p2p`).

use crate::element::narrow_into;
use crate::op::{gather_mismatch, scatter_mismatch};
use crate::{
    CommElement, CommError, InProcessCommunicator, InProcessGroup, MpiCommunicator, ReduceOp,
};

/// Where a peer replica lives.
enum Peer {
    /// In this process, at this local rank.
    Local(usize),
    /// In MPI rank `process`, at local rank `local`.
    Remote { process: usize, local: usize },
}

/// One local replica of a process in a multi-process, multi-replica world.
#[derive(Debug)]
pub struct HybridCommunicator {
    local: InProcessCommunicator,
    /// The process's MPI rank, held by local rank 0 only.
    mpi: Option<MpiCommunicator>,
    process: usize,
    processes: usize,
}

/// Splits this process's MPI rank into `local_size` replicas (every process must use the
/// same `local_size`). Returns one communicator per local replica, in local-rank order.
///
/// # Panics
/// If `local_size` is zero.
pub fn hybrid_group(mpi: MpiCommunicator, local_size: usize) -> Vec<crate::Communicator> {
    let (process, processes) = (mpi.rank(), mpi.world_size());
    let mut mpi = Some(mpi);
    let timeout = mpi
        .as_ref()
        .map(MpiCommunicator::timeout)
        .unwrap_or(crate::DEFAULT_TIMEOUT);
    InProcessGroup::new(local_size)
        .timeout(timeout)
        .build()
        .into_iter()
        .map(|comm| match comm {
            crate::Communicator::InProcess(local) => {
                crate::Communicator::Hybrid(HybridCommunicator {
                    mpi: if local.rank() == 0 { mpi.take() } else { None },
                    local,
                    process,
                    processes,
                })
            }
            other => other,
        })
        .collect()
}

impl HybridCommunicator {
    /// The global rank.
    pub fn rank(&self) -> usize {
        self.process * self.local.world_size() + self.local.rank()
    }

    /// Replicas in the world.
    pub fn world_size(&self) -> usize {
        self.processes * self.local.world_size()
    }

    /// The timeout of every operation.
    pub fn timeout(&self) -> std::time::Duration {
        self.local.timeout()
    }

    /// Runs `op` on local rank 0's MPI communicator; a failure poisons the local group so
    /// the other local ranks stop waiting.
    fn across<T>(
        &self,
        op: impl FnOnce(&MpiCommunicator) -> Result<T, CommError>,
    ) -> Result<Option<T>, CommError> {
        let Some(mpi) = &self.mpi else {
            return Ok(None);
        };
        op(mpi)
            .map(Some)
            .inspect_err(|err| self.local.abort(format!("process {}: {err}", self.process)))
    }

    /// All-reduce: locally, across processes, then broadcast locally.
    pub fn all_reduce<T: CommElement>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let partial = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        self.local.all_reduce(data, partial)?;
        self.across(|mpi| mpi.all_reduce(data, partial))?;
        self.local.broadcast(data, 0)?;
        if op == ReduceOp::Mean {
            let world = self.world_size() as f32;
            data.iter_mut()
                .for_each(|v| *v = T::from_f32(v.to_f32() / world));
        }
        Ok(())
    }

    /// Broadcast from global rank `root`.
    pub fn broadcast<T: CommElement>(&self, data: &mut [T], root: usize) -> Result<(), CommError> {
        let local_size = self.local.world_size();
        if root >= self.world_size() {
            return Err(CommError::InvalidArgument {
                op: "broadcast",
                rank: self.rank(),
                detail: format!("rank {root} is outside the world of {}", self.world_size()),
            });
        }
        // Within the root's process this brings the data to local rank 0; elsewhere it is
        // harmless and keeps every process's local ranks in the same sequence of collectives.
        self.local.broadcast(data, root % local_size)?;
        self.across(|mpi| mpi.broadcast(data, root / local_size))?;
        self.local.broadcast(data, 0)
    }

    /// All-gather in global-rank order.
    pub fn all_gather<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), CommError> {
        if let Some(detail) = gather_mismatch(self.world_size(), input.len(), output.len()) {
            return Err(CommError::InvalidArgument {
                op: "all_gather",
                rank: self.rank(),
                detail,
            });
        }
        let mut local = vec![T::from_f32(0.0); self.local.world_size() * input.len()];
        self.local.all_gather(input, &mut local)?;
        self.across(|mpi| mpi.all_gather(&local, output))?;
        self.local.broadcast(output, 0)
    }

    /// Reduce-scatter (as an all-reduce followed by taking this rank's part).
    pub fn reduce_scatter<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        if let Some(detail) = scatter_mismatch(self.world_size(), input.len(), output.len()) {
            return Err(CommError::InvalidArgument {
                op: "reduce_scatter",
                rank: self.rank(),
                detail,
            });
        }
        let mut full = input.to_vec();
        self.all_reduce(&mut full, op)?;
        let part = output.len();
        output.copy_from_slice(&full[self.rank() * part..(self.rank() + 1) * part]);
        Ok(())
    }

    /// Barrier over every replica of every process.
    pub fn barrier(&self) -> Result<(), CommError> {
        self.local.barrier()?;
        self.across(MpiCommunicator::barrier)?;
        self.local.barrier()
    }

    /// Sends to global rank `dst`: through shared memory within this process, through MPI
    /// (on this thread, non-blocking, polled against the timeout) to another process.
    /// Returns once the message is taken (within a process: queued; across: handed to MPI).
    pub fn send<T: CommElement>(&self, data: &[T], dst: usize) -> Result<(), CommError> {
        match self.locate("send", dst)? {
            Peer::Local(local) => self.local.send(data, local),
            Peer::Remote { process, local } => {
                let wide: Vec<f32> = data.iter().map(|v| v.to_f32()).collect();
                let tag = self.tag(self.local.rank(), local);
                crate::mpi_p2p::send(&self.endpoint(), &wide, process, tag)
            }
        }
    }

    /// Receives from global rank `src` (the lengths must match).
    pub fn recv<T: CommElement>(&self, data: &mut [T], src: usize) -> Result<(), CommError> {
        match self.locate("recv", src)? {
            Peer::Local(local) => self.local.recv(data, local),
            Peer::Remote { process, local } => {
                let tag = self.tag(local, self.local.rank());
                let values = crate::mpi_p2p::recv(&self.endpoint(), data.len(), process, tag)?;
                narrow_into(data, &values);
                Ok(())
            }
        }
    }

    /// Where global rank `peer` lives.
    fn locate(&self, op: &'static str, peer: usize) -> Result<Peer, CommError> {
        if peer >= self.world_size() {
            return Err(CommError::InvalidArgument {
                op,
                rank: self.rank(),
                detail: format!("rank {peer} is outside the world of {}", self.world_size()),
            });
        }
        let local_size = self.local.world_size();
        let (process, local) = (peer / local_size, peer % local_size);
        Ok(if process == self.process {
            Peer::Local(local)
        } else {
            Peer::Remote { process, local }
        })
    }

    /// The MPI tag of messages from local replica `from` to local replica `to` (MPI's
    /// source rank already names the process). Tag 0 stays the MPI backend's.
    fn tag(&self, from: usize, to: usize) -> i32 {
        (1 + from * self.local.world_size() + to) as i32
    }

    fn endpoint(&self) -> crate::mpi_p2p::Endpoint<'_> {
        crate::mpi_p2p::Endpoint {
            rank: self.rank(),
            timeout: self.timeout(),
            local: &self.local,
        }
    }

    /// Aborts: the local group is poisoned and the MPI job is aborted.
    pub fn abort(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.local.abort(reason.clone());
        crate::mpi_backend::abort_job(self.rank(), &reason);
    }

    pub(crate) fn local_shared(&self) -> std::sync::Arc<crate::in_process::Shared> {
        self.local.shared()
    }
}
