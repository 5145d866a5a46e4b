//! Building a group of in-process communicators.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use super::collectives::InProcessCommunicator;
use super::rendezvous::Rendezvous;
use crate::{Communicator, DEFAULT_TIMEOUT};

/// A rank's staging buffer, split into one chunk per rank so that rank `c` can reduce
/// chunk `c` of every buffer without contending with the others.
pub(crate) type Slot = Vec<Mutex<Vec<f32>>>;

/// What the ranks of one group share.
#[derive(Debug)]
pub struct Shared {
    pub world_size: usize,
    pub timeout: Duration,
    pub rendezvous: Rendezvous,
    /// `slots[r]`: rank `r`'s contribution to the current collective.
    pub slots: Vec<Slot>,
    /// `reduced[c]`: the reduced chunk `c`, written by rank `c`.
    pub reduced: Vec<Mutex<Vec<f32>>>,
    /// `outputs[r]`: rank `r`'s reduced chunks in `all_reduce_buffer`, kept apart from its
    /// inputs until every rank has finished, so that a failure leaves every input intact.
    pub outputs: Vec<Slot>,
}

/// Builds the N communicators of one in-process group.
///
/// ```
/// let comms = kiln_comm::InProcessGroup::new(2)
///     .timeout(std::time::Duration::from_secs(5))
///     .build();
/// assert_eq!(comms.len(), 2);
/// assert_eq!(comms[1].rank(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct InProcessGroup {
    world_size: usize,
    timeout: Duration,
}

impl InProcessGroup {
    /// A group of `world_size` ranks.
    ///
    /// # Panics
    /// If `world_size` is zero.
    pub fn new(world_size: usize) -> Self {
        assert!(world_size > 0, "a group needs at least one rank");
        Self {
            world_size,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// How long any blocking operation may wait for the other ranks.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// One communicator per rank, in rank order. Move each to its own thread.
    pub fn build(self) -> Vec<Communicator> {
        let n = self.world_size;
        let chunked = || (0..n).map(|_| Mutex::new(Vec::new())).collect::<Vec<_>>();
        let shared = Arc::new(Shared {
            world_size: n,
            timeout: self.timeout,
            rendezvous: Rendezvous::new(n),
            slots: (0..n).map(|_| chunked()).collect(),
            reduced: chunked(),
            outputs: (0..n).map(|_| chunked()).collect(),
        });
        // A channel per ordered (source, destination) pair for send/recv.
        let mut senders: Vec<Vec<Option<Sender<Vec<f32>>>>> = vec![vec![None; n]; n];
        let mut receivers: Vec<Vec<Option<Receiver<Vec<f32>>>>> = vec![vec![None; n]; n];
        for (src, row) in senders.iter_mut().enumerate() {
            for (dst, sender) in row.iter_mut().enumerate() {
                let (tx, rx) = crossbeam_channel::unbounded();
                *sender = Some(tx);
                receivers[dst][src] = Some(rx);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (to, from))| {
                Communicator::InProcess(InProcessCommunicator::new(
                    rank,
                    Arc::clone(&shared),
                    to.into_iter().map(Option::unwrap).collect(),
                    from.into_iter().map(Option::unwrap).collect(),
                ))
            })
            .collect()
    }
}
