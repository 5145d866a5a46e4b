//! The inputs and expected results every collective check uses: the in-process unit tests
//! and the MPI check program (`examples/mpi_check.rs` includes this file by path).

use crate::ReduceOp;

/// Rank `rank`'s deterministic input of length `len`.
pub fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 31 + rank * 17) % 97) as f32 * 0.25 - 12.0)
        .collect()
}

/// What reducing every rank's [`input`] with `op` gives, in rank order.
pub fn reference(world: usize, len: usize, op: ReduceOp) -> Vec<f32> {
    let mut acc = input(0, len);
    for rank in 1..world {
        for (a, v) in acc.iter_mut().zip(input(rank, len)) {
            *a = match op {
                ReduceOp::Sum | ReduceOp::Mean => *a + v,
                ReduceOp::Max => a.max(v),
                ReduceOp::Min => a.min(v),
            };
        }
    }
    if op == ReduceOp::Mean {
        acc.iter_mut().for_each(|a| *a /= world as f32);
    }
    acc
}
