//! An MPI all-reduce in rank order, bit-identical to the in-process backend's.
//!
//! MPI's own all-reduce may add the ranks' values in any order (recursive halving, a ring,
//! whatever the library picks for the size), so beyond two ranks its sums differ in the last
//! bits from the in-process backend's, which adds rank 0's values, then rank 1's, and so on.
//! Where a run across processes must train bit for bit like the same run in one process (a
//! pipeline stage's data-parallel copies adding their gradients), this reduction does it the
//! in-process way: each rank takes one block of every rank's buffer (all-to-all), combines
//! the blocks in rank order, then every rank gathers the combined blocks (all-gather). That
//! moves 2(N−1)/N of the buffer per rank, as a ring all-reduce does.

use mpi::traits::CommunicatorCollectives;

use crate::{CommError, MpiCommunicator, ReduceOp};

impl MpiCommunicator {
    /// All-reduce of `f32` values in place, combining the ranks' values in rank order (rank
    /// 0's, then 1's, …): the same bits as the in-process backend's all-reduce, for any
    /// number of ranks. Every rank must pass a buffer of the same length.
    ///
    /// # Errors
    /// [`CommError::PeerLost`] if the MPI thread has stopped (a timeout aborts the job, as
    /// every MPI collective's does).
    pub fn all_reduce_in_rank_order(
        &self,
        data: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (ranks, len) = (self.world_size(), data.len());
        if ranks == 1 {
            op.finish(data, 1);
            return Ok(());
        }
        // Equal blocks (the last padded) keep MPI's all-to-all and all-gather simple; padding
        // never mixes with values, as every element is combined only with itself.
        let block = len.div_ceil(ranks);
        let mut padded = vec![0.0f32; block * ranks];
        padded[..len].copy_from_slice(data);
        let reduced = self.call("all_reduce", move |comm| {
            let mut blocks = vec![0.0f32; block * ranks];
            comm.all_to_all_into(&padded[..], &mut blocks[..]);
            let mut own = blocks[..block].to_vec();
            for values in blocks.chunks_exact(block.max(1)).skip(1) {
                op.combine(&mut own, values);
            }
            op.finish(&mut own, ranks);
            let mut all = vec![0.0f32; block * ranks];
            comm.all_gather_into(&own[..], &mut all[..]);
            all
        })?;
        data.copy_from_slice(&reduced[..len]);
        Ok(())
    }
}
