//! Which samples each rank reads in an epoch.

use rand::seq::SliceRandom;

use crate::rng::derived_rng;

/// Splits a data set's indices over ranks, like PyTorch's `DistributedSampler`.
///
/// Every rank gets the same number of samples per epoch: without `drop_last` the shuffled
/// list is padded by wrapping around, with it the tail that does not divide evenly is
/// dropped. With [`weights`](Self::weights) the shares are proportional to the weights
/// instead (uneven hardware), still covering every index once per epoch.
/// The order depends only on (seed, epoch), so all ranks agree without communicating.
///
/// ```
/// use kiln_data::DistributedSampler;
/// let a = DistributedSampler::new(10, 0, 2).shuffle(3).indices(0);
/// let b = DistributedSampler::new(10, 1, 2).shuffle(3).indices(0);
/// let mut all: Vec<_> = a.iter().chain(&b).copied().collect();
/// all.sort();
/// assert_eq!(all, (0..10).collect::<Vec<_>>());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DistributedSampler {
    len: usize,
    rank: usize,
    world_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    weights: Option<Vec<f64>>,
    batches: Option<Vec<usize>>,
}

impl DistributedSampler {
    /// Rank `rank` of `world_size` over a data set of `len` samples, in order, padded.
    ///
    /// # Panics
    /// If `rank >= world_size`.
    pub fn new(len: usize, rank: usize, world_size: usize) -> Self {
        assert!(
            rank < world_size,
            "rank {rank} is outside a world of {world_size}"
        );
        Self {
            len,
            rank,
            world_size,
            seed: None,
            drop_last: false,
            weights: None,
            batches: None,
        }
    }

    /// Shuffles with `seed` (reshuffled every epoch).
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Drops the tail instead of padding.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Gives rank `r` a share proportional to `weights[r]` (e.g. measured throughput).
    ///
    /// # Panics
    /// If there is not one positive, finite weight per rank.
    pub fn weights(mut self, weights: Vec<f64>) -> Self {
        assert_eq!(weights.len(), self.world_size, "one weight per rank");
        assert!(
            weights.iter().all(|w| w.is_finite() && *w > 0.0),
            "weights must be positive"
        );
        self.weights = Some(weights);
        self
    }

    /// Each rank's batch per step (they sum to the global batch): step `s` of the epoch
    /// takes the shuffled order's samples `s·G .. (s+1)·G` and rank `r` the part of them
    /// after the ranks before it. A step's samples are then the same for any split of the
    /// same global batch (a run resumed on another number of replicas continues with the
    /// same samples per step); a rank's loader must use `batches[rank]` as its batch size.
    /// Without `drop_last` the last step wraps around to the epoch's start.
    ///
    /// ```
    /// use kiln_data::DistributedSampler;
    /// let even = |r| DistributedSampler::new(20, r, 2).shuffle(1).batch_shares(vec![5, 5]);
    /// let uneven = |r| DistributedSampler::new(20, r, 3).shuffle(1).batch_shares(vec![4, 3, 3]);
    /// let step = |indices: Vec<usize>, b: usize, s: usize| indices[s * b..(s + 1) * b].to_vec();
    /// for s in 0..2 {
    ///     let mut a: Vec<usize> = (0..2).flat_map(|r| step(even(r).indices(0), 5, s)).collect();
    ///     let mut b: Vec<usize> =
    ///         (0..3).flat_map(|r| step(uneven(r).indices(0), [4, 3, 3][r], s)).collect();
    ///     a.sort();
    ///     b.sort();
    ///     assert_eq!(a, b, "step {s} takes the same samples");
    /// }
    /// ```
    ///
    /// # Panics
    /// If `batches` does not have one positive entry per rank.
    pub fn batch_shares(mut self, batches: Vec<usize>) -> Self {
        assert_eq!(batches.len(), self.world_size, "one batch per rank");
        assert!(batches.iter().all(|&b| b > 0), "batches must be positive");
        self.batches = Some(batches);
        self
    }

    /// Steps of an epoch with batch shares summing to `global`.
    fn steps(&self, global: usize) -> usize {
        if self.drop_last {
            self.len / global
        } else {
            self.len.div_ceil(global)
        }
    }

    /// Samples of this rank per epoch.
    pub fn num_samples(&self) -> usize {
        self.shares()[self.rank]
    }

    /// How many samples each rank reads per epoch.
    pub fn shares(&self) -> Vec<usize> {
        if let Some(batches) = &self.batches {
            let steps = self.steps(batches.iter().sum());
            return batches.iter().map(|b| steps * b).collect();
        }
        match &self.weights {
            None => {
                let per_rank = if self.drop_last {
                    self.len / self.world_size
                } else {
                    self.len.div_ceil(self.world_size)
                };
                vec![per_rank; self.world_size]
            }
            Some(weights) => proportional_split(self.len, weights),
        }
    }

    /// The whole epoch's order, before it is split over ranks.
    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.seed {
            order.shuffle(&mut derived_rng(seed, 0x5A3D_11E5, epoch));
        }
        order
    }

    /// This rank's indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let order = self.epoch_order(epoch);
        if order.is_empty() {
            return Vec::new();
        }
        if let Some(batches) = &self.batches {
            let global: usize = batches.iter().sum();
            let before: usize = batches[..self.rank].iter().sum();
            let mine = batches[self.rank];
            return (0..self.steps(global))
                .flat_map(|s| (0..mine).map(move |i| s * global + before + i))
                .map(|position| order[position % order.len()])
                .collect();
        }
        match &self.weights {
            None => {
                let total = self.num_samples() * self.world_size;
                (self.rank..total)
                    .step_by(self.world_size)
                    .map(|i| order[i % order.len()])
                    .collect()
            }
            Some(_) => {
                let shares = self.shares();
                let start: usize = shares[..self.rank].iter().sum();
                order[start..start + shares[self.rank]].to_vec()
            }
        }
    }
}

/// Splits `len` into parts proportional to `weights` (largest remainder, ties to lower
/// ranks): the parts sum to `len` and each differs from its exact share by less than one.
/// Negative weights count as zero; all-zero weights give everything to the remainders' order.
pub fn proportional_split(len: usize, weights: &[f64]) -> Vec<usize> {
    let total: f64 = weights
        .iter()
        .map(|w| w.max(0.0))
        .sum::<f64>()
        .max(f64::MIN_POSITIVE);
    let exact: Vec<f64> = weights
        .iter()
        .map(|w| len as f64 * w.max(0.0) / total)
        .collect();
    let mut shares: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut left = len - shares.iter().sum::<usize>();
    let mut by_remainder: Vec<usize> = (0..weights.len()).collect();
    by_remainder.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor())
            .total_cmp(&(exact[a] - exact[a].floor()))
            .then(a.cmp(&b))
    });
    for rank in by_remainder {
        if left == 0 {
            break;
        }
        shares[rank] += 1;
        left -= 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ranks(
        len: usize,
        world: usize,
        build: impl Fn(DistributedSampler) -> DistributedSampler,
        epoch: u64,
    ) -> Vec<Vec<usize>> {
        (0..world)
            .map(|rank| build(DistributedSampler::new(len, rank, world)).indices(epoch))
            .collect()
    }

    #[test]
    fn padded_shares_are_equal_and_cover_every_index() {
        for (len, world) in [(10, 3), (7, 7), (5, 8), (100, 4), (1, 2)] {
            let parts = all_ranks(len, world, |s| s.shuffle(9), 2);
            let per_rank = len.div_ceil(world);
            assert!(parts.iter().all(|p| p.len() == per_rank));
            let mut counts = vec![0; len];
            parts.iter().flatten().for_each(|&i| counts[i] += 1);
            assert!(counts.iter().all(|&c| c >= 1), "every index is read");
            assert_eq!(
                counts.iter().sum::<usize>() - len,
                per_rank * world - len,
                "only the padding repeats"
            );
        }
    }

    #[test]
    fn drop_last_reads_each_index_at_most_once_and_drops_only_the_tail() {
        for (len, world) in [(10, 3), (7, 7), (5, 8), (101, 4)] {
            let parts = all_ranks(len, world, |s| s.shuffle(1).drop_last(true), 0);
            let mut seen: Vec<usize> = parts.iter().flatten().copied().collect();
            assert!(parts.iter().all(|p| p.len() == len / world));
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), (len / world) * world, "no index twice");
        }
    }

    #[test]
    fn weighted_shares_are_proportional_and_partition_the_epoch() {
        let parts = all_ranks(1000, 3, |s| s.shuffle(5).weights(vec![1.0, 2.0, 1.0]), 4);
        assert_eq!(
            parts.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![250, 500, 250]
        );
        let mut all: Vec<usize> = parts.into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert_eq!(proportional_split(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
    }

    #[test]
    fn set_epoch_reshuffles_consistently_across_ranks() {
        let a0 = all_ranks(50, 2, |s| s.shuffle(7), 0);
        let a1 = all_ranks(50, 2, |s| s.shuffle(7), 1);
        assert_ne!(a0, a1);
        assert_eq!(a0, all_ranks(50, 2, |s| s.shuffle(7), 0));
        let unshuffled = DistributedSampler::new(6, 1, 2).indices(3);
        assert_eq!(unshuffled, vec![1, 3, 5]);
    }
}
