//! The loader and the iterator over one epoch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::RecvTimeoutError;
use std::time::{Duration, Instant};

use super::builder::DataLoaderBuilder;
use super::collate::BatchRecipe;
use super::worker::{Plan, Worker};
use crate::{DataError, DistributedSampler, ImageBatch, ImageSource};

/// A prefetching, deterministic, multi-worker loader of [`ImageBatch`]es.
///
/// Batch `b` of an epoch is always built by worker `b mod num_workers` and consumed in order,
/// so the sequence of batches for a (seed, epoch) is the same for any number of workers.
/// Workers persist across epochs; dropping the loader stops and joins them.
pub struct DataLoader {
    recipe: Arc<BatchRecipe>,
    sampler: DistributedSampler,
    batch_size: usize,
    drop_last: bool,
    workers: Vec<Worker>,
    generation: Arc<AtomicU64>,
    waited: Duration,
    timeout: Duration,
}

impl DataLoader {
    /// Starts configuring a loader over `source`.
    pub fn builder(source: impl ImageSource) -> DataLoaderBuilder {
        DataLoaderBuilder::new(source)
    }

    pub(super) fn start(
        recipe: Arc<BatchRecipe>,
        sampler: DistributedSampler,
        batch_size: usize,
        drop_last: bool,
        num_workers: usize,
        prefetch: usize,
        timeout: Duration,
    ) -> Self {
        let generation = Arc::new(AtomicU64::new(0));
        let workers = (0..num_workers)
            .map(|id| Worker::spawn(id, Arc::clone(&recipe), prefetch, Arc::clone(&generation)))
            .collect();
        Self {
            recipe,
            sampler,
            batch_size,
            drop_last,
            workers,
            generation,
            waited: Duration::ZERO,
            timeout,
        }
    }

    /// The sample indices of every batch of `epoch`, in order.
    pub fn batch_indices(&self, epoch: u64) -> Vec<Vec<usize>> {
        let indices = self.sampler.indices(epoch);
        indices
            .chunks(self.batch_size)
            .filter(|chunk| !self.drop_last || chunk.len() == self.batch_size)
            .map(<[usize]>::to_vec)
            .collect()
    }

    /// Number of batches per epoch.
    pub fn num_batches(&self) -> usize {
        let samples = self.sampler.num_samples();
        if self.drop_last {
            samples / self.batch_size
        } else {
            samples.div_ceil(self.batch_size)
        }
    }

    /// The device batches are built on.
    pub fn device(&self) -> &burn::tensor::Device {
        &self.recipe.device
    }

    /// Total time the consumer has waited for batches (for stall measurement).
    pub fn time_waited(&self) -> Duration {
        self.waited
    }

    /// Iterates over the batches of `epoch` (reshuffled per epoch, as `set_epoch` does).
    pub fn epoch(&mut self, epoch: u64) -> EpochIter<'_> {
        self.epoch_from(epoch, 0)
    }

    /// Iterates over the batches of `epoch` from batch `first` on: the same batches, with the
    /// same samples and augmentation, that [`epoch`](Self::epoch) yields from its `first`-th
    /// on, without loading the ones before (what a resumed run continues with).
    pub fn epoch_from(&mut self, epoch: u64, first: usize) -> EpochIter<'_> {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let batches = self.batch_indices(epoch);
        let total = batches.len();
        let first = first.min(total);
        let batches = batches.into_iter().enumerate().skip(first);
        let mut pending = std::collections::VecDeque::new();
        if self.workers.is_empty() {
            pending.extend(batches.map(|(_, indices)| indices));
        } else {
            let n = self.workers.len();
            let mut plans: Vec<Vec<(usize, Vec<usize>)>> = vec![Vec::new(); n];
            // Batch b still goes to worker b mod n: each worker's order is unchanged.
            for (b, indices) in batches {
                plans[b % n].push((b, indices));
            }
            for (worker, batches) in self.workers.iter().zip(plans) {
                if let Some(plans) = &worker.plans {
                    // A worker that died shows up as a lost batch when it is due.
                    let _ = plans.send(Plan {
                        generation,
                        epoch,
                        batches,
                    });
                }
            }
        }
        EpochIter {
            loader: self,
            epoch,
            generation,
            next: first,
            total,
            pending,
        }
    }
}

impl Drop for DataLoader {
    fn drop(&mut self) {
        // Invalidate queued work, close the plan channels and drop the delivery receivers:
        // a worker blocked on a full queue then fails its send and exits at once.
        self.generation.fetch_add(1, Ordering::AcqRel);
        let handles: Vec<_> = self
            .workers
            .drain(..)
            .filter_map(|mut worker| {
                worker.plans.take();
                worker.handle.take()
            })
            .collect();
        for handle in handles {
            let _ = handle.join();
        }
    }
}

/// The batches of one epoch, in order. Dropping it early abandons the rest of the epoch.
pub struct EpochIter<'a> {
    loader: &'a mut DataLoader,
    epoch: u64,
    generation: u64,
    next: usize,
    total: usize,
    /// The batches still to build, when there are no workers.
    pending: std::collections::VecDeque<Vec<usize>>,
}

impl EpochIter<'_> {
    /// Total time the consumer has waited for batches, this epoch and before (the loader's
    /// [`time_waited`](DataLoader::time_waited), readable while iterating).
    pub fn time_waited(&self) -> Duration {
        self.loader.waited
    }

    /// Batches not yet returned.
    pub fn remaining(&self) -> usize {
        self.total - self.next
    }

    fn receive(&mut self, batch: usize) -> Result<ImageBatch, DataError> {
        let n = self.loader.workers.len();
        let worker = &self.loader.workers[batch % n];
        let start = Instant::now();
        loop {
            let waited = start.elapsed();
            let remaining = self.loader.timeout.saturating_sub(waited);
            match worker.deliveries.recv_timeout(remaining) {
                Ok(delivery) if delivery.generation == self.generation => {
                    debug_assert_eq!(delivery.batch, batch);
                    return delivery.result;
                }
                Ok(_stale) => continue, // left over from an abandoned epoch
                Err(RecvTimeoutError::Timeout) => {
                    return Err(DataError::Timeout {
                        worker: batch % n,
                        batch,
                        waited: start.elapsed(),
                    });
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(DataError::WorkerLost {
                        worker: batch % n,
                        batch,
                    });
                }
            }
        }
    }
}

impl Iterator for EpochIter<'_> {
    type Item = Result<ImageBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        let batch = self.next;
        self.next += 1;
        let start = Instant::now();
        let result = if self.loader.workers.is_empty() {
            let indices = self.pending.pop_front()?;
            self.loader.recipe.build(self.epoch, indices)
        } else {
            self.receive(batch)
        };
        self.loader.waited += start.elapsed();
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining(), Some(self.remaining()))
    }
}

impl ExactSizeIterator for EpochIter<'_> {}
