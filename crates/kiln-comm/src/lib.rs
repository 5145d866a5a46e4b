//! Collective communication for kiln.
//!
//! Kiln's data-parallel training (gradient sync, parameter and statistics averaging) and its
//! pipelines across processes talk through a [`Communicator`]: `rank()`, `world_size()`,
//! `all_reduce`, `broadcast`, `all_gather`, `reduce_scatter`, `barrier`, `send` and `recv`,
//! on `f32`, `f16` and `bf16` buffers (half buffers are reduced in `f32`); across processes
//! `split` makes sub-groups (`MPI_Comm_split`: a pipeline's stage copies, its stages) and
//! `MpiMessages` (feature `mpi`) carries byte messages whose length the receiver learns.
//!
//! Backends are a closed set, so [`Communicator`] is an enum rather than a trait object
//! (as crossbeam does with its channel flavours):
//! - [`InProcessGroup`]: N communicators for N threads of one process, reducing through
//!   shared memory: each rank reduces 1/N of the buffer (reduce-scatter), then every rank
//!   copies the reduced chunks back (all-gather).
//! - `MpiCommunicator` (feature `mpi`): one rank per process over MPI (`mpirun`), across
//!   machines; one thread owns MPI.
//! - `HybridCommunicator` (feature `mpi`): several replicas per process (shared memory)
//!   times several processes (MPI).
//!
//! - [`DeviceGroup`]: device tensors on the distinct GPUs of one process, reduced by Burn's
//!   own collective (NCCL on CUDA, feature `cuda`) without leaving the devices.
//!
//! [`CommWorker`] runs a rank's operations on a communication thread and hands back
//! [`Pending`] results, so communication overlaps computation.
//!
//! **No hangs.** Every blocking call has a timeout ([`InProcessGroup::timeout`], default
//! [`DEFAULT_TIMEOUT`]) and fails with a [`CommError`]. A rank that times out, panics or drops
//! its communicator poisons the group: every other rank's pending and next operation fails
//! promptly with [`CommError::PeerLost`].
//!
//! ```
//! use kiln_comm::{InProcessGroup, ReduceOp};
//!
//! let comms = InProcessGroup::new(3).build();
//! let handles: Vec<_> = comms
//!     .into_iter()
//!     .map(|comm| {
//!         std::thread::spawn(move || {
//!             let mut data = vec![comm.rank() as f32; 4];
//!             comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
//!             data
//!         })
//!     })
//!     .collect();
//! for handle in handles {
//!     assert_eq!(handle.join().unwrap(), vec![3.0; 4]); // 0 + 1 + 2
//! }
//! ```
#![warn(missing_docs)]

mod buffer;
#[cfg(test)]
mod check_inputs;
mod communicator;
mod device;
mod element;
mod error;
#[cfg(feature = "mpi")]
mod hybrid;
mod in_process;
#[cfg(feature = "mpi")]
mod mpi_backend;
#[cfg(feature = "mpi")]
mod mpi_half;
#[cfg(feature = "mpi")]
mod mpi_messages;
#[cfg(feature = "mpi")]
mod mpi_ordered;
#[cfg(feature = "mpi")]
mod mpi_p2p;
mod mpi_tags;
mod op;
mod value_range;
mod worker;

pub use buffer::ReduceBuffer;
pub use communicator::Communicator;
pub use device::{DeviceGroup, PendingTensor};
pub use element::CommElement;
pub use error::CommError;
#[cfg(feature = "mpi")]
pub use hybrid::{HybridCommunicator, hybrid_group};
pub use in_process::{InProcessCommunicator, InProcessGroup};
#[cfg(feature = "mpi")]
pub use mpi_backend::MpiCommunicator;
#[cfg(feature = "mpi")]
pub use mpi_messages::MpiMessages;
pub use op::ReduceOp;
pub use worker::{AbortHandle, CommWorker, Pending, Timed};

/// The timeout of every blocking operation unless configured otherwise.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
