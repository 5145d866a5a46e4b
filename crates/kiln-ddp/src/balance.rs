//! Splitting a global batch over replicas in proportion to their measured speed.

use kiln_comm::{CommError, CommWorker};

/// How a global batch is split over replicas of uneven speed.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSplit {
    /// Each replica's measured throughput (samples/s), by rank.
    pub throughput: Vec<f64>,
    /// Each replica's batch size, by rank; they sum to the global batch.
    pub batches: Vec<usize>,
}

impl BatchSplit {
    /// Weights for [`DataLoaderBuilder::shard_weights`](kiln_data::DataLoaderBuilder::shard_weights),
    /// so that every replica's data share matches its batch share (same steps per epoch).
    pub fn weights(&self) -> Vec<f64> {
        self.batches.iter().map(|&b| b as f64).collect()
    }
}

/// Shares `my_throughput` with every replica and splits `global_batch` in proportion
/// (largest remainder; every replica gets at least one sample).
///
/// Gradients are weighted by sample count in the all-reduce, so the update equals one step
/// on the whole global batch however it is split.
pub(crate) fn split_batch(
    comm: &CommWorker,
    my_throughput: f64,
    global_batch: usize,
) -> Result<BatchSplit, CommError> {
    let world = comm.world_size();
    let mine = [my_throughput as f32];
    let throughput: Vec<f64> = comm
        .run(move |c| {
            let mut all = vec![0.0f32; world];
            c.all_gather(&mine, &mut all).map(|_| all)
        })?
        .into_iter()
        .map(f64::from)
        .collect();
    Ok(BatchSplit {
        batches: proportional(global_batch, &throughput),
        throughput,
    })
}

/// Splits `total` in proportion to `weights` (largest remainder, ties to lower ranks), then
/// moves single samples from the largest part to any empty one, if `total` allows.
fn proportional(total: usize, weights: &[f64]) -> Vec<usize> {
    let n = weights.len();
    let mut parts = kiln_data::proportional_split(total, weights);
    if total >= n {
        while let Some(empty) = parts.iter().position(|&p| p == 0) {
            let largest = (0..n)
                .max_by_key(|&i| (parts[i], std::cmp::Reverse(i)))
                .expect("n > 0");
            parts[largest] -= 1;
            parts[empty] += 1;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::proportional;

    #[test]
    fn batches_follow_throughput_and_sum_to_the_global_batch() {
        assert_eq!(proportional(32, &[100.0, 300.0]), vec![8, 24]);
        assert_eq!(proportional(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(
            proportional(4, &[1000.0, 1.0]),
            vec![3, 1],
            "every replica gets a sample"
        );
        assert_eq!(proportional(64, &[2.5, 1.0, 0.5]).iter().sum::<usize>(), 64);
    }
}
