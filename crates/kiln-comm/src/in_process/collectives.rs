//! The collectives of one in-process rank.
//!
//! Every collective follows the same three phases, separated by the group's rendezvous:
//! 1. each rank stages its input in its own slot (converting half types to `f32`);
//! 2. each rank works on its share (rank `c` reduces chunk `c` across all slots: the
//!    reduce-scatter), so the reduction runs on all ranks in parallel;
//! 3. each rank copies the result out (the all-gather), then a last rendezvous frees the slots
//!    for the next operation.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::group::Shared;
use crate::buffer::chunk_range;
use crate::element::{narrow_into, widen_into};
use crate::op::{gather_mismatch, scatter_mismatch};
use crate::{CommElement, CommError, ReduceBuffer, ReduceOp};

/// How often a blocked `recv` looks at the group's poison.
const POLL: Duration = Duration::from_millis(20);

/// One rank of an [`InProcessGroup`](super::InProcessGroup).
///
/// Dropping it (including by a panic unwinding its thread) poisons the group, so the other
/// ranks fail instead of waiting for it.
#[derive(Debug)]
pub struct InProcessCommunicator {
    rank: usize,
    shared: Arc<Shared>,
    to: Vec<Sender<Vec<f32>>>,
    from: Vec<Receiver<Vec<f32>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Buffers are overwritten before every use, so data left by a panicking holder is harmless.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl InProcessCommunicator {
    pub(super) fn new(
        rank: usize,
        shared: Arc<Shared>,
        to: Vec<Sender<Vec<f32>>>,
        from: Vec<Receiver<Vec<f32>>>,
    ) -> Self {
        Self {
            rank,
            shared,
            to,
            from,
        }
    }

    /// This rank's index in `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.shared.world_size
    }

    /// The timeout of every blocking operation.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn sync(&self, op: &'static str) -> Result<(), CommError> {
        self.shared
            .rendezvous
            .wait(op, self.rank, self.shared.timeout)
    }

    fn fail(&self, op: &'static str, detail: String) -> CommError {
        self.shared.rendezvous.poison(
            self.rank,
            format!("rank {} failed `{op}`: {detail}", self.rank),
        );
        CommError::InvalidArgument {
            op,
            rank: self.rank,
            detail,
        }
    }

    /// Stages `data` in this rank's slot, chunked over the ranks.
    fn stage<T: CommElement>(&self, data: &[T]) {
        let n = self.world_size();
        for (chunk, cell) in self.shared.slots[self.rank].iter().enumerate() {
            widen_into(&mut lock(cell), &data[chunk_range(data.len(), n, chunk)]);
        }
    }

    /// Reduces chunk `chunk` over every rank's slot into `out`.
    fn reduce_chunk(
        &self,
        op: &'static str,
        chunk: usize,
        reduce: ReduceOp,
        out: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let slots = &self.shared.slots;
        out.clear();
        out.extend_from_slice(&lock(&slots[0][chunk]));
        for (peer, slot) in slots.iter().enumerate().skip(1) {
            let values = lock(&slot[chunk]);
            if values.len() != out.len() {
                return Err(self.fail(
                    op,
                    format!("buffer lengths differ between ranks (chunk {chunk}: rank 0 has {}, rank {peer} has {})", out.len(), values.len()),
                ));
            }
            reduce.combine(out, &values);
        }
        reduce.finish(out, self.world_size());
        Ok(())
    }

    /// Reduces `data` element-wise over all ranks, in place; every rank gets the result.
    ///
    /// Half-precision buffers are reduced in `f32` and rounded once at the end. The
    /// summation order is fixed (rank 0, 1, …), so results are deterministic.
    pub fn all_reduce<T: CommElement>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        const OP: &str = "all_reduce";
        let n = self.world_size();
        if n == 1 {
            let mut acc: Vec<f32> = data.iter().map(|v| v.to_f32()).collect();
            op.finish(&mut acc, 1);
            narrow_into(data, &acc);
            return Ok(());
        }
        self.stage(data);
        self.sync(OP)?;
        {
            let mut reduced = lock(&self.shared.reduced[self.rank]);
            self.reduce_chunk(OP, self.rank, op, &mut reduced)?;
        }
        self.sync(OP)?;
        for chunk in 0..n {
            let range = chunk_range(data.len(), n, chunk);
            let reduced = lock(&self.shared.reduced[chunk]);
            if reduced.len() != range.len() {
                return Err(self.fail(
                    OP,
                    format!("buffer lengths differ between ranks (chunk {chunk})"),
                ));
            }
            narrow_into(&mut data[range], &reduced);
        }
        // No closing rendezvous: `reduced` is rewritten only after the next collective's first
        // rendezvous, which every rank reaches after this copy.
        Ok(())
    }

    /// Reduces `buffer` over all ranks in place without staging copies.
    ///
    /// Its chunks move into this rank's slot (no copy); rank `c` reduces chunk `c` of every
    /// slot into every rank's output chunk `c`; once all ranks are done, each takes its output
    /// chunks as its buffer's chunks (again no copy), and its inputs stay behind as the spare
    /// allocation the next reduction writes into.
    ///
    /// On an error the caller gets its buffer back as it was, values included: inputs are
    /// never written, and the outputs are taken only after every rank has finished reducing.
    pub fn all_reduce_buffer(
        &self,
        buffer: &mut ReduceBuffer,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        const OP: &str = "all_reduce_buffer";
        let n = self.world_size();
        if buffer.world_size() != n {
            return Err(self.fail(
                OP,
                format!(
                    "buffer laid out for {} ranks, group has {n}",
                    buffer.world_size()
                ),
            ));
        }
        if n == 1 {
            buffer
                .chunks_mut()
                .for_each(|(_, chunk)| op.finish(chunk, 1));
            return Ok(());
        }
        let slot = &self.shared.slots[self.rank];
        let output = &self.shared.outputs[self.rank];
        for (chunk, cell) in buffer.chunks.iter_mut().zip(slot) {
            std::mem::swap(chunk, &mut lock(cell));
        }
        let reduced = self
            .sync(OP)
            .and_then(|()| self.reduce_column(OP, op))
            .and_then(|()| self.sync(OP));
        for ((chunk, input), output) in buffer.chunks.iter_mut().zip(slot).zip(output) {
            // Take the inputs back (the slot gets the spare the buffer held) and, once every
            // rank has reduced, trade them for the outputs: the inputs become the allocation
            // the next reduction writes into.
            std::mem::swap(chunk, &mut lock(input));
            if reduced.is_ok() {
                std::mem::swap(chunk, &mut lock(output));
            }
        }
        // No closing rendezvous: the next collective touches other ranks' slots and outputs
        // only after its own first rendezvous, which this rank reaches after this exchange.
        reduced
    }

    /// Rank `c`'s share of `all_reduce_buffer`: chunk `c` of every rank's input, reduced into
    /// chunk `c` of every rank's output.
    fn reduce_column(&self, name: &'static str, op: ReduceOp) -> Result<(), CommError> {
        let column = self.rank;
        let inputs: Vec<_> = self
            .shared
            .slots
            .iter()
            .map(|slot| lock(&slot[column]))
            .collect();
        let len = inputs[0].len();
        if let Some(peer) = inputs.iter().position(|values| values.len() != len) {
            let peer_len = inputs[peer].len();
            drop(inputs);
            // A rank that failed first takes its inputs back, which can show up here as a
            // length mismatch: report its failure rather than this symptom.
            self.shared.rendezvous.check(name, self.rank)?;
            return Err(self.fail(
                name,
                format!(
                    "buffer lengths differ between ranks (chunk {column}: rank 0 has {len}, \
                     rank {peer} has {peer_len})"
                ),
            ));
        }
        let mut outputs: Vec<_> = self
            .shared
            .outputs
            .iter()
            .map(|output| lock(&output[column]))
            .collect();
        let (first, rest) = outputs.split_at_mut(1);
        let acc = &mut first[0];
        // At least two ranks: `n == 1` never gets here.
        op.combine_into(acc, &inputs[0], &inputs[1]);
        for values in &inputs[2..] {
            op.combine(acc, values);
        }
        op.finish(acc, self.world_size());
        for output in rest {
            output.clear();
            output.extend_from_slice(acc);
        }
        Ok(())
    }

    /// Copies `root`'s `data` into every other rank's `data`.
    pub fn broadcast<T: CommElement>(&self, data: &mut [T], root: usize) -> Result<(), CommError> {
        const OP: &str = "broadcast";
        self.check_rank(OP, root)?;
        if self.world_size() == 1 {
            return Ok(());
        }
        if self.rank == root {
            self.stage(data);
        }
        self.sync(OP)?;
        if self.rank != root {
            let n = self.world_size();
            for chunk in 0..n {
                let range = chunk_range(data.len(), n, chunk);
                let values = lock(&self.shared.slots[root][chunk]);
                if values.len() != range.len() {
                    return Err(self.fail(
                        OP,
                        format!(
                            "root has {} elements in chunk {chunk}, this rank expects {}",
                            values.len(),
                            range.len()
                        ),
                    ));
                }
                narrow_into(&mut data[range], &values);
            }
        }
        self.sync(OP)
    }

    /// Concatenates every rank's `input` in rank order into `output`.
    ///
    /// `output.len()` must be `world_size × input.len()`.
    pub fn all_gather<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), CommError> {
        const OP: &str = "all_gather";
        let n = self.world_size();
        if let Some(detail) = gather_mismatch(n, input.len(), output.len()) {
            return Err(self.fail(OP, detail));
        }
        if n == 1 {
            output.copy_from_slice(input);
            return Ok(());
        }
        self.stage(input);
        self.sync(OP)?;
        for (peer, out) in output.chunks_mut(input.len().max(1)).enumerate().take(n) {
            let mut offset = 0;
            for cell in &self.shared.slots[peer] {
                let values = lock(cell);
                if offset + values.len() > out.len() {
                    return Err(self.fail(
                        OP,
                        format!("rank {peer} contributed more than {} elements", input.len()),
                    ));
                }
                narrow_into(&mut out[offset..offset + values.len()], &values);
                offset += values.len();
            }
        }
        self.sync(OP)
    }

    /// Reduces `input` over all ranks and gives rank `r` the `r`-th of `world_size` equal parts.
    ///
    /// `input.len()` must be `world_size × output.len()`.
    pub fn reduce_scatter<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        const OP: &str = "reduce_scatter";
        let n = self.world_size();
        if let Some(detail) = scatter_mismatch(n, input.len(), output.len()) {
            return Err(self.fail(OP, detail));
        }
        self.stage(input);
        self.sync(OP)?;
        let mut reduced = Vec::with_capacity(output.len());
        self.reduce_chunk(OP, self.rank, op, &mut reduced)?;
        narrow_into(output, &reduced);
        self.sync(OP)
    }

    /// Blocks until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<(), CommError> {
        self.sync("barrier")
    }

    /// Sends `data` to rank `dst` (returns without waiting for the receiver).
    pub fn send<T: CommElement>(&self, data: &[T], dst: usize) -> Result<(), CommError> {
        const OP: &str = "send";
        self.check_rank(OP, dst)?;
        self.shared.rendezvous.check(OP, self.rank)?;
        let payload = data.iter().map(|v| v.to_f32()).collect();
        self.to[dst].send(payload).map_err(|_| CommError::PeerLost {
            op: OP,
            rank: self.rank,
            peer: dst,
            reason: format!("rank {dst} dropped its communicator"),
        })
    }

    /// Receives into `data` what rank `src` sent; the lengths must match.
    pub fn recv<T: CommElement>(&self, data: &mut [T], src: usize) -> Result<(), CommError> {
        const OP: &str = "recv";
        self.check_rank(OP, src)?;
        let start = Instant::now();
        let payload = loop {
            self.shared.rendezvous.check(OP, self.rank)?;
            let waited = start.elapsed();
            if waited >= self.shared.timeout {
                self.shared.rendezvous.poison(
                    self.rank,
                    format!("rank {} timed out in `recv` from rank {src}", self.rank),
                );
                return Err(CommError::Timeout {
                    op: OP,
                    rank: self.rank,
                    waited,
                });
            }
            match self.from[src].recv_timeout(POLL.min(self.shared.timeout - waited)) {
                Ok(payload) => break payload,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CommError::PeerLost {
                        op: OP,
                        rank: self.rank,
                        peer: src,
                        reason: format!("rank {src} dropped its communicator"),
                    });
                }
            }
        };
        if payload.len() != data.len() {
            return Err(self.fail(
                OP,
                format!(
                    "rank {src} sent {} elements, expected {}",
                    payload.len(),
                    data.len()
                ),
            ));
        }
        narrow_into(data, &payload);
        Ok(())
    }

    fn check_rank(&self, op: &'static str, peer: usize) -> Result<(), CommError> {
        if peer < self.world_size() {
            Ok(())
        } else {
            Err(CommError::InvalidArgument {
                op,
                rank: self.rank,
                detail: format!("rank {peer} is outside the group of {}", self.world_size()),
            })
        }
    }

    /// Fails once the group is poisoned (a rank failed, panicked or left).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn check_alive(&self) -> Result<(), CommError> {
        self.shared.rendezvous.check("recv", self.rank)
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Fails every later operation of the group with `reason` (for a rank that hit an error
    /// outside communication and is about to stop).
    pub fn abort(&self, reason: impl Into<String>) {
        self.shared.rendezvous.poison(self.rank, reason);
    }
}

impl Drop for InProcessCommunicator {
    fn drop(&mut self) {
        let how = if std::thread::panicking() {
            "panicked"
        } else {
            "dropped its communicator"
        };
        self.shared
            .rendezvous
            .poison(self.rank, format!("rank {} {how}", self.rank));
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_range;

    #[test]
    fn chunks_cover_the_buffer_without_overlap() {
        for len in [0, 1, 2, 7, 64, 1001] {
            for parts in 1..=8 {
                let mut next = 0;
                for chunk in 0..parts {
                    let range = chunk_range(len, parts, chunk);
                    assert_eq!(range.start, next);
                    next = range.end;
                }
                assert_eq!(next, len);
            }
        }
    }
}
