//! A batch's blocks of images, shared by the im2col and Winograd paths: which images a
//! block holds, and the weight gradients' sum over blocks in an order fixed by the shapes.

use std::ops::Range;

use rayon::prelude::*;

/// The images of block `index` of `size` images each, in a batch of `batch`.
pub(crate) fn block(index: usize, size: usize, batch: usize) -> Range<usize> {
    index * size..((index + 1) * size).min(batch)
}

/// Partial sums computed in parallel and then added in order.
const GROUPS: usize = 8;

/// Elements per parallel piece of the groups' final addition.
const ADD_PIECE: usize = 16 * 1024;

/// `Σ` over `blocks` blocks of what `add_block` adds, as a vector of `len`.
///
/// The blocks are cut into at most [`GROUPS`] consecutive groups, summed in parallel (each
/// with its own `scratch()` buffers, reused block after block), and the groups' partial sums
/// are then added in group order: the grouping follows `blocks` only, never the thread
/// count, so neither does the result. `add_block(partial, accumulate, index, scratch)`
/// writes block `index`'s contribution into `partial`, overwriting it when `accumulate` is
/// false (the group's first block) and adding to it otherwise.
pub(crate) fn sum_over_blocks<S>(
    blocks: usize,
    len: usize,
    scratch: impl Fn() -> S + Sync,
    add_block: impl Fn(&mut [f32], bool, usize, &mut S) + Sync,
) -> Vec<f32> {
    if blocks == 0 {
        return vec![0.0; len];
    }
    let groups = blocks.min(GROUPS);
    let per_group = blocks.div_ceil(groups);
    let partials: Vec<Vec<f32>> = (0..blocks.div_ceil(per_group))
        .into_par_iter()
        .map(|group| {
            let mut partial = vec![0.0f32; len];
            let mut buffers = scratch();
            let members = group * per_group..((group + 1) * per_group).min(blocks);
            for (n, index) in members.enumerate() {
                add_block(&mut partial, n > 0, index, &mut buffers);
            }
            partial
        })
        .collect();
    let mut partials = partials.into_iter();
    let mut total = partials.next().unwrap_or_else(|| vec![0.0; len]);
    let rest: Vec<Vec<f32>> = partials.collect();
    // Every element adds the groups in group order, whichever piece (thread) it falls in.
    total
        .par_chunks_mut(ADD_PIECE)
        .enumerate()
        .for_each(|(piece, sums)| {
            for partial in &rest {
                let part = &partial[piece * ADD_PIECE..][..sums.len()];
                sums.iter_mut().zip(part).for_each(|(t, p)| *t += p);
            }
        });
    total
}

#[cfg(test)]
mod tests {
    use super::sum_over_blocks;
    use crate::test_support::in_pool;

    #[test]
    fn every_block_is_added_once_in_any_pool() {
        for blocks in [0, 1, 5, 8, 9, 23] {
            let run = |threads: usize| {
                in_pool(threads, || {
                    sum_over_blocks(
                        blocks,
                        3,
                        || (),
                        |partial, accumulate, index, _| {
                            for (k, p) in partial.iter_mut().enumerate() {
                                let value = (index * 3 + k) as f32 * 0.1;
                                *p = if accumulate { *p + value } else { value };
                            }
                        },
                    )
                })
            };
            let expected: Vec<f32> = (0..3)
                .map(|k| (0..blocks).map(|i| (i * 3 + k) as f32).sum::<f32>())
                .collect();
            let one = run(1);
            for (got, want) in one.iter().zip(&expected) {
                assert!(
                    (got - want * 0.1).abs() < 1e-3,
                    "{blocks}: {got} vs {}",
                    want * 0.1
                );
            }
            assert_eq!(one, run(3), "{blocks} blocks");
        }
    }

    /// Long sums add in pieces: each element still adds the groups in group order.
    #[test]
    fn long_sums_add_every_group_in_any_pool() {
        let len = 40_000;
        let run = |threads: usize| {
            in_pool(threads, || {
                sum_over_blocks(
                    11,
                    len,
                    || (),
                    |partial, accumulate, index, _| {
                        for (k, p) in partial.iter_mut().enumerate() {
                            let value = ((index * 7 + k) % 13) as f32;
                            *p = if accumulate { *p + value } else { value };
                        }
                    },
                )
            })
        };
        let one = run(1);
        for (k, got) in one.iter().enumerate() {
            let want: f32 = (0..11).map(|i| ((i * 7 + k) % 13) as f32).sum();
            assert_eq!(*got, want, "element {k}");
        }
        assert_eq!(one, run(3));
    }
}
