//! Configuring a [`DataLoader`].

use std::sync::Arc;

use burn::tensor::Device;

use super::collate::BatchRecipe;
use super::epoch::DataLoader;
use crate::{DataError, DistributedSampler, ImageSource, Transform};

/// Builds a [`DataLoader`]; see the crate docs for an example.
pub struct DataLoaderBuilder {
    source: Box<dyn ImageSource>,
    batch_size: usize,
    num_workers: usize,
    prefetch: usize,
    timeout: std::time::Duration,
    seed: Option<u64>,
    drop_last: bool,
    shard: (usize, usize),
    weights: Option<Vec<f64>>,
    batches: Option<Vec<usize>>,
    device: Device,
    transforms: Vec<Transform>,
}

impl DataLoaderBuilder {
    pub(crate) fn new(source: impl ImageSource) -> Self {
        Self {
            source: Box::new(source),
            batch_size: 32,
            num_workers: 0,
            prefetch: 2,
            timeout: std::time::Duration::from_secs(600),
            seed: None,
            drop_last: false,
            shard: (0, 1),
            weights: None,
            batches: None,
            device: Device::flex(),
            transforms: Vec::new(),
        }
    }

    /// Samples per batch (default 32).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Worker threads; 0 builds batches in the caller's thread (default 0).
    pub fn num_workers(mut self, num_workers: usize) -> Self {
        self.num_workers = num_workers;
        self
    }

    /// Finished batches each worker may hold ahead of the consumer (default 2).
    pub fn prefetch(mut self, prefetch: usize) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// How long the consumer waits for a worker's batch before failing with
    /// [`DataError::Timeout`](crate::DataError::Timeout) (default 10 minutes): a worker stuck
    /// in a data source cannot hang training.
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Shuffles every epoch from `seed`; also seeds the random transforms.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Drops the last, incomplete batch (and the sampler's uneven tail).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Reads only rank `rank`'s share of `world_size` (see [`DistributedSampler`]).
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.shard = (rank, world_size);
        self
    }

    /// Uneven shares proportional to `weights`, one per rank (see [`DistributedSampler::weights`]).
    pub fn shard_weights(mut self, weights: Vec<f64>) -> Self {
        self.weights = Some(weights);
        self
    }

    /// Each rank's batch per step, this rank's being this loader's batch size: every step
    /// then takes a contiguous run of the epoch's order whatever the split (see
    /// [`DistributedSampler::batch_shares`]).
    pub fn shard_batches(mut self, batches: Vec<usize>) -> Self {
        self.batches = Some(batches);
        self
    }

    /// Where batches are built (default: the Flex CPU device).
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Per-sample transforms, applied in order in the workers.
    pub fn transforms(mut self, transforms: Vec<Transform>) -> Self {
        self.transforms = transforms;
        self
    }

    /// Starts the workers.
    ///
    /// # Panics
    /// If `batch_size` or `prefetch` is zero, or the shard is invalid; [`try_build`](Self::try_build)
    /// returns those as errors.
    pub fn build(self) -> DataLoader {
        self.try_build().unwrap_or_else(|err| panic!("{err}"))
    }

    /// Starts the workers, or says which setting is unusable.
    ///
    /// # Errors
    ///
    /// [`DataError::Config`] if `batch_size` or `prefetch` is zero or the shard's rank is
    /// outside its world.
    pub fn try_build(self) -> Result<DataLoader, DataError> {
        let (rank, world) = self.shard;
        if self.batch_size == 0 {
            return Err(DataError::Config("batch_size must be at least 1".into()));
        }
        if self.prefetch == 0 {
            return Err(DataError::Config(
                "prefetch must be at least 1 batch".into(),
            ));
        }
        if rank >= world {
            return Err(DataError::Config(format!(
                "shard rank {rank} is outside a world of {world}"
            )));
        }

        let mut sampler =
            DistributedSampler::new(self.source.len(), rank, world).drop_last(self.drop_last);
        if let Some(seed) = self.seed {
            sampler = sampler.shuffle(seed);
        }
        let weighted = self.weights.is_some();
        if let Some(weights) = self.weights {
            sampler = sampler.weights(weights);
        }
        if let Some(batches) = self.batches {
            if weighted {
                return Err(DataError::Config(
                    "shard_weights and shard_batches both split the data: give one".into(),
                ));
            }
            if batches.len() != world || batches.contains(&0) {
                return Err(DataError::Config(format!(
                    "shard_batches needs one positive batch per rank of {world}, got {batches:?}"
                )));
            }
            if batches[rank] != self.batch_size {
                return Err(DataError::Config(format!(
                    "rank {rank}'s batch share is {}, its batch size {}: they must be equal",
                    batches[rank], self.batch_size
                )));
            }
            sampler = sampler.batch_shares(batches);
        }
        let recipe = Arc::new(BatchRecipe {
            source: self.source,
            transforms: self.transforms,
            device: self.device,
            seed: self.seed.unwrap_or(0),
        });
        Ok(DataLoader::start(
            recipe,
            sampler,
            self.batch_size,
            self.drop_last,
            self.num_workers,
            self.prefetch,
            self.timeout,
        ))
    }
}
