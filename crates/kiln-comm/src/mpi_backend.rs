//! The MPI backend: one rank per process, across machines (`mpirun -np N`).
//!
//! MPI communicators are not `Send`, and MPI is initialised once per process. So one thread
//! owns MPI: it initialises it (`MPI_THREAD_MULTIPLE`), runs the operations this rank submits
//! in order, and finalises it when the communicator is dropped. Callers wait for each result
//! with the configured timeout. MPI collectives cannot be cancelled, so a timeout aborts the
//! whole job (`MPI_Abort`) instead of returning: this rank first prints the timeout error
//! (which rank gave up, in which operation, after how long), then the launcher terminates
//! every rank, this one included, instead of letting them wait forever.
//!
//! `f32` reductions use MPI's own `MPI_SUM`/`MAX`/`MIN`. MPI has no half type and
//! user-defined reductions would need libffi, so half-precision all-reduce gathers the 16-bit
//! values and reduces them in f32 locally (up to three ranks, where that moves fewer bytes)
//! or widens to f32 (beyond).
//!
//! [`MpiCommunicator::split`] makes sub-communicators (`MPI_Comm_split`): the MPI thread
//! holds them beside the world, and a split handle runs its operations there too, so every
//! wait stays bounded the same way. A handle's `rank` and `world_size` are the group's.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};
use mpi::collective::SystemOperation;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Destination, Root, Source};

use crate::element::narrow_into;
use crate::mpi_half::{HALF_GATHER_MAX_RANKS, HalfEncoding};
use crate::op::{gather_mismatch, scatter_mismatch};
use crate::{CommElement, CommError, ReduceOp};

mod splits;

use splits::Registry;

type Job = Box<dyn FnOnce(&mut Registry) + Send>;

pub(crate) use crate::mpi_tags::MAX_CONTEXTS;

/// This process's rank of the MPI world, or of a group split from it
/// ([`MpiCommunicator::split`]).
#[derive(Debug)]
pub struct MpiCommunicator {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    /// The communicator's index in the MPI thread's registry (0: the world).
    id: usize,
    /// Agreed by the group's members, unique among this process's communicators (0: the
    /// world): keeps messages of different groups apart.
    context: u32,
    /// The world rank of each rank of this communicator.
    members: Arc<[usize]>,
    thread: Arc<MpiThread>,
}

/// The thread that owns MPI; the last handle to go stops it (which finalises MPI).
#[derive(Debug)]
struct MpiThread {
    /// `MPI_TAG_UB`: the largest message tag this MPI allows (`None` if it does not say).
    largest_tag: Option<i64>,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl MpiCommunicator {
    /// Initialises MPI on a dedicated thread and joins the world communicator.
    ///
    /// Fails with [`CommError::Startup`] if MPI was already initialised in this process or
    /// its thread could not start.
    pub fn world(timeout: Duration) -> Result<crate::Communicator, CommError> {
        let (jobs, receive_jobs) = crossbeam_channel::unbounded::<Job>();
        let (ready, started) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("kiln-mpi".into())
            .spawn(move || {
                let Some((universe, threading)) =
                    mpi::initialize_with_threading(mpi::Threading::Multiple)
                else {
                    let _ = ready.send(None);
                    return;
                };
                crate::mpi_p2p::set_thread_multiple(threading == mpi::Threading::Multiple);
                let world = universe.world();
                let tags = crate::mpi_tags::tag_upper_bound(&world);
                let _ = ready.send(Some((world.rank() as usize, world.size() as usize, tags)));
                let mut registry = Registry {
                    comms: vec![Some(world)],
                    next_context: 1,
                };
                while let Ok(job) = receive_jobs.recv() {
                    job(&mut registry);
                }
                // The splits are freed before `universe` drops: MPI_Finalize, on the thread
                // that initialised MPI.
                drop(registry);
            })
            .map_err(|e| CommError::Startup(format!("cannot spawn the MPI thread: {e}")))?;
        let (rank, world_size, tags) = match started.recv() {
            Ok(Some(started)) => started,
            Ok(None) => {
                return Err(CommError::Startup(
                    "MPI is already initialised in this process (call \
                     `MpiCommunicator::world` once per process)"
                        .into(),
                ));
            }
            Err(_) => {
                return Err(CommError::Startup(
                    "the MPI thread stopped while initialising MPI (see its panic message)".into(),
                ));
            }
        };
        let world = Self {
            rank,
            world_size,
            timeout,
            id: 0,
            context: 0,
            members: (0..world_size).collect(),
            thread: Arc::new(MpiThread {
                largest_tag: tags,
                jobs: Some(jobs),
                thread: Some(thread),
            }),
        };
        // Every rank runs the same MPI, so every rank refuses alike (dropping the world
        // finalises MPI).
        crate::mpi_tags::check_tag_range(tags, &Self::library_version())?;
        Ok(crate::Communicator::Mpi(world))
    }

    /// The MPI library's own version string (`MPI_Get_library_version`, callable before MPI
    /// is initialised), e.g. "Open MPI v4.1.4, ...".
    pub fn library_version() -> String {
        mpi::environment::library_version()
            .map(|text| text.trim_end_matches(['\0', '\n', ' ']).to_string())
            .unwrap_or_else(|err| format!("(unreadable: {err})"))
    }

    /// Whether MPI granted `MPI_THREAD_MULTIPLE` when this process initialised it (false
    /// before): without it pipeline stages across processes are refused.
    pub fn thread_multiple() -> bool {
        crate::mpi_p2p::thread_multiple()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the world.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The timeout of every operation.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `op` on the MPI thread, with this communicator, and waits for its result.
    pub(crate) fn call<T: Send + 'static>(
        &self,
        name: &'static str,
        op: impl FnOnce(&SimpleCommunicator) -> T + Send + 'static,
    ) -> Result<T, CommError> {
        let id = self.id;
        self.call_registry(name, move |registry| op(registry.live(id)))
    }

    /// The largest message tag this MPI allows (`MPI_TAG_UB`; `None` if it does not say):
    /// checked against kiln's tags when the world starts.
    pub fn largest_tag(&self) -> Option<i64> {
        self.thread.largest_tag
    }

    /// Runs `op` on the MPI thread, with its registry, and waits for its result.
    fn call_registry<T: Send + 'static>(
        &self,
        name: &'static str,
        op: impl FnOnce(&mut Registry) -> T + Send + 'static,
    ) -> Result<T, CommError> {
        let (reply, result) = crossbeam_channel::bounded(1);
        let job: Job = Box::new(move |registry| {
            let _ = reply.send(op(registry));
        });
        let lost = || CommError::PeerLost {
            op: name,
            rank: self.rank,
            peer: self.rank,
            reason: "the MPI thread stopped".into(),
        };
        self.thread
            .jobs
            .as_ref()
            .ok_or_else(lost)?
            .send(job)
            .map_err(|_| lost())?;
        match result.recv_timeout(self.timeout) {
            Ok(value) => Ok(value),
            Err(RecvTimeoutError::Disconnected) => Err(lost()),
            Err(RecvTimeoutError::Timeout) => {
                let err = CommError::Timeout {
                    op: name,
                    rank: self.rank,
                    waited: self.timeout,
                };
                // Never returns: the collective cannot be cancelled, so the job ends here.
                abort_job(self.rank, &err.to_string())
            }
        }
    }

    fn reduce_f32(
        &self,
        name: &'static str,
        data: Vec<f32>,
        op: ReduceOp,
    ) -> Result<Vec<f32>, CommError> {
        let world = self.world_size;
        self.call(name, move |comm| {
            let mut out = vec![0.0f32; data.len()];
            comm.all_reduce_into(&data[..], &mut out[..], system_op(op));
            op.finish(&mut out, world);
            out
        })
    }

    /// All-reduce in place (halves are reduced in `f32`).
    pub fn all_reduce<T: CommElement>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        if let Some(encoding) = HalfEncoding::of::<T>()
            && self.world_size <= HALF_GATHER_MAX_RANKS
        {
            return self.all_reduce_half(data, op, encoding);
        }
        let wide = data.iter().map(|v| v.to_f32()).collect();
        let out = self.reduce_f32("all_reduce", wide, op)?;
        narrow_into(data, &out);
        Ok(())
    }

    /// Half-precision all-reduce that keeps halves on the wire: all-gather the 16-bit
    /// patterns, then reduce in f32 locally, in rank order (so every rank gets the same bits).
    /// Each rank receives (N−1)·n halves, against about 2(N−1)/N·n f32 values for a ring
    /// all-reduce: less traffic up to three ranks, which is where it is used.
    fn all_reduce_half<T: CommElement>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        encoding: HalfEncoding,
    ) -> Result<(), CommError> {
        let bits: Vec<u16> = data.iter().map(|v| encoding.encode(v.to_f32())).collect();
        let (len, world) = (data.len(), self.world_size);
        let gathered = self.call("all_reduce", move |comm| {
            let mut all = vec![0u16; len * world];
            comm.all_gather_into(&bits[..], &mut all[..]);
            all
        })?;
        let mut acc: Vec<f32> = gathered[..len]
            .iter()
            .map(|&b| encoding.decode(b))
            .collect();
        for rank in 1..world {
            let values: Vec<f32> = gathered[rank * len..(rank + 1) * len]
                .iter()
                .map(|&b| encoding.decode(b))
                .collect();
            op.combine(&mut acc, &values);
        }
        op.finish(&mut acc, world);
        narrow_into(data, &acc);
        Ok(())
    }

    /// Broadcast from `root`.
    pub fn broadcast<T: CommElement>(&self, data: &mut [T], root: usize) -> Result<(), CommError> {
        self.check_rank("broadcast", root)?;
        let mut wide: Vec<f32> = data.iter().map(|v| v.to_f32()).collect();
        let out = self.call("broadcast", move |comm| {
            comm.process_at_rank(root as i32)
                .broadcast_into(&mut wide[..]);
            wide
        })?;
        narrow_into(data, &out);
        Ok(())
    }

    /// All-gather in rank order.
    pub fn all_gather<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), CommError> {
        if let Some(detail) = gather_mismatch(self.world_size, input.len(), output.len()) {
            return Err(self.invalid("all_gather", detail));
        }
        let wide: Vec<f32> = input.iter().map(|v| v.to_f32()).collect();
        let len = output.len();
        let out = self.call("all_gather", move |comm| {
            let mut out = vec![0.0f32; len];
            comm.all_gather_into(&wide[..], &mut out[..]);
            out
        })?;
        narrow_into(output, &out);
        Ok(())
    }

    /// Reduce-scatter into equal parts.
    pub fn reduce_scatter<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        if let Some(detail) = scatter_mismatch(self.world_size, input.len(), output.len()) {
            return Err(self.invalid("reduce_scatter", detail));
        }
        let wide: Vec<f32> = input.iter().map(|v| v.to_f32()).collect();
        let (len, world) = (output.len(), self.world_size);
        let out = self.call("reduce_scatter", move |comm| {
            let mut out = vec![0.0f32; len];
            comm.reduce_scatter_block_into(&wide[..], &mut out[..], system_op(op));
            op.finish(&mut out, world);
            out
        })?;
        narrow_into(output, &out);
        Ok(())
    }

    /// Barrier.
    pub fn barrier(&self) -> Result<(), CommError> {
        self.call("barrier", |comm| comm.barrier())
    }

    /// Sends to `dst` (blocks the MPI thread until MPI has taken the message).
    pub fn send<T: CommElement>(&self, data: &[T], dst: usize) -> Result<(), CommError> {
        self.check_rank("send", dst)?;
        let wide: Vec<f32> = data.iter().map(|v| v.to_f32()).collect();
        self.call("send", move |comm| {
            comm.process_at_rank(dst as i32).send(&wide[..])
        })
    }

    /// Receives from `src`; the lengths must match.
    pub fn recv<T: CommElement>(&self, data: &mut [T], src: usize) -> Result<(), CommError> {
        self.check_rank("recv", src)?;
        let len = data.len();
        let (out, count) = self.call("recv", move |comm| {
            let mut out = vec![0.0f32; len];
            let status = comm.process_at_rank(src as i32).receive_into(&mut out[..]);
            (out, status.count(f32::equivalent_datatype()) as usize)
        })?;
        if count != len {
            return Err(self.invalid(
                "recv",
                format!("rank {src} sent {count} elements, expected {len}"),
            ));
        }
        narrow_into(data, &out);
        Ok(())
    }

    /// Terminates every process of the job (`MPI_Abort`) after printing `reason`.
    pub fn abort(&self, reason: impl Into<String>) {
        abort_job(self.rank, &reason.into());
    }

    fn check_rank(&self, op: &'static str, peer: usize) -> Result<(), CommError> {
        if peer < self.world_size {
            Ok(())
        } else {
            Err(self.invalid(
                op,
                format!("rank {peer} is outside the world of {}", self.world_size),
            ))
        }
    }

    fn invalid(&self, op: &'static str, detail: String) -> CommError {
        CommError::InvalidArgument {
            op,
            rank: self.rank,
            detail,
        }
    }
}

use mpi::datatype::Equivalence as _;

/// `MPI_Abort` on the world: the launcher terminates every rank.
pub(crate) fn abort_job(rank: usize, reason: &str) -> ! {
    eprintln!("kiln: rank {rank} aborts the MPI job: {reason}");
    SimpleCommunicator::world().abort(1)
}

/// MPI's built-in operation for the reduction part of `op` (a mean is summed, then divided
/// by `ReduceOp::finish`).
fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

impl Drop for MpiThread {
    fn drop(&mut self) {
        self.jobs.take();
        // As for `CommWorker`: never wait for a possibly stuck MPI thread while a panic
        // unwinds; the failure is reported and the job aborted instead.
        if std::thread::panicking() {
            return;
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
