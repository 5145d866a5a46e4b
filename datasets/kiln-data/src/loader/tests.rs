//! The loader's promises: same batches for any worker count, errors as `Err`, prompt drop.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::{DataError, DataLoader, ImageItem, ImageSource, SyntheticImages, Transform};

fn batches(workers: usize, epoch: u64) -> Vec<(Vec<usize>, Vec<f32>, Vec<i64>)> {
    batches_from(workers, epoch, 0)
}

/// The batches of `epoch` from batch `first` on.
fn batches_from(workers: usize, epoch: u64, first: usize) -> Vec<(Vec<usize>, Vec<f32>, Vec<i64>)> {
    let data = SyntheticImages::new(53, 4, 11, [3, 8, 8]);
    let mut loader = DataLoader::builder(data)
        .batch_size(8)
        .num_workers(workers)
        .prefetch(1)
        .shuffle(5)
        .transforms(Transform::cifar_augmentation())
        .build();
    loader
        .epoch_from(epoch, first)
        .map(|b| {
            let b = b.unwrap();
            (
                b.indices,
                b.images.into_data().try_to_vec::<f32>().unwrap(),
                b.labels
                    .into_data()
                    .convert::<i64>()
                    .try_to_vec::<i64>()
                    .unwrap(),
            )
        })
        .collect()
}

#[test]
fn batch_sequence_and_augmentation_are_identical_for_any_worker_count() {
    for epoch in [0, 3] {
        let reference = batches(0, epoch);
        assert_eq!(reference.len(), 7, "53 samples in batches of 8");
        for workers in [1, 2, 4] {
            assert!(
                batches(workers, epoch) == reference,
                "{workers} workers differ in epoch {epoch}"
            );
        }
    }
    assert!(batches(2, 0) != batches(2, 1), "epochs are reshuffled");
}

#[test]
fn a_resumed_epoch_continues_with_exactly_the_batches_not_yet_seen() {
    let whole = batches(0, 2);
    for workers in [0, 1, 3] {
        for first in [0, 1, 4, 7, 9] {
            let rest = batches_from(workers, 2, first);
            assert!(
                rest == whole[first.min(whole.len())..],
                "{workers} workers from batch {first}"
            );
        }
    }
}

#[test]
fn every_index_is_read_once_per_epoch_and_drop_last_drops_the_partial_batch() {
    let mut loader = DataLoader::builder(SyntheticImages::new(20, 2, 1, [1, 2, 2]))
        .batch_size(6)
        .num_workers(2)
        .shuffle(1)
        .build();
    let mut seen: Vec<usize> = loader.epoch(0).flat_map(|b| b.unwrap().indices).collect();
    seen.sort();
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    let mut loader = DataLoader::builder(SyntheticImages::new(20, 2, 1, [1, 2, 2]))
        .batch_size(6)
        .drop_last(true)
        .build();
    assert_eq!(loader.num_batches(), 3);
    assert_eq!(loader.epoch(0).count(), 3);
}

#[test]
fn shards_partition_the_epoch() {
    let mut all = Vec::new();
    for rank in 0..3 {
        let mut loader = DataLoader::builder(SyntheticImages::new(30, 2, 1, [1, 2, 2]))
            .batch_size(4)
            .shard(rank, 3)
            .shuffle(2)
            .num_workers(1)
            .build();
        all.extend(loader.epoch(1).flat_map(|b| b.unwrap().indices));
    }
    all.sort();
    assert_eq!(all, (0..30).collect::<Vec<_>>());
}

/// A source whose sample 13 fails and sample 21 panics.
struct Faulty;

impl ImageSource for Faulty {
    fn len(&self) -> usize {
        32
    }
    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        match index {
            13 => Err(DataError::Item {
                index,
                detail: "bad record".into(),
            }),
            21 => panic!("corrupt sample {index}"),
            _ => Ok(ImageItem {
                pixels: vec![0.0; 4],
                shape: [1, 2, 2],
                label: 0,
            }),
        }
    }
}

#[test]
fn a_failing_or_panicking_item_reaches_the_consumer_as_err() {
    for workers in [0, 2] {
        let mut loader = DataLoader::builder(Faulty)
            .batch_size(4)
            .num_workers(workers)
            .build();
        let results: Vec<_> = loader.epoch(0).collect();
        assert_eq!(results.len(), 8);
        assert!(
            matches!(&results[3], Err(DataError::Item { index: 13, .. })),
            "{:?}",
            results[3].as_ref().err()
        );
        assert!(
            matches!(&results[5], Err(DataError::WorkerPanicked { index: 21, message }) if message.contains("corrupt"))
        );
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            6,
            "the other batches still arrive"
        );
    }
}

/// A source that counts reads and is slow enough to fill the queues.
struct Counting(Arc<AtomicUsize>);

impl ImageSource for Counting {
    fn len(&self) -> usize {
        10_000
    }
    fn get(&self, _index: usize) -> Result<ImageItem, DataError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(ImageItem {
            pixels: vec![0.5; 3 * 16 * 16],
            shape: [3, 16, 16],
            label: 1,
        })
    }
}

#[test]
fn dropping_the_loader_joins_workers_blocked_on_full_queues() {
    let reads = Arc::new(AtomicUsize::new(0));
    let mut loader = DataLoader::builder(Counting(Arc::clone(&reads)))
        .batch_size(2)
        .num_workers(4)
        .prefetch(1)
        .build();
    let first = loader.epoch(0).next().unwrap().unwrap();
    assert_eq!(first.indices, vec![0, 1]);
    std::thread::sleep(Duration::from_millis(100)); // let every worker fill its queue and block
    let read_before_drop = reads.load(Ordering::Relaxed);
    assert!(
        read_before_drop < 40,
        "prefetch is bounded: {read_before_drop} samples read"
    );
    let start = Instant::now();
    drop(loader);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "drop took {:?}",
        start.elapsed()
    );
}

#[test]
fn an_abandoned_epoch_does_not_leak_into_the_next() {
    let mut loader = DataLoader::builder(SyntheticImages::new(40, 2, 1, [1, 2, 2]))
        .batch_size(4)
        .num_workers(2)
        .shuffle(3)
        .build();
    let _ = loader.epoch(0).next();
    let second: Vec<Vec<usize>> = loader.epoch(1).map(|b| b.unwrap().indices).collect();
    assert_eq!(second, loader.batch_indices(1));
}

#[test]
fn any_burn_dataset_plugs_in() {
    use burn::data::dataset::InMemDataset;
    let items: Vec<ImageItem> = (0..10)
        .map(|i| ImageItem {
            pixels: vec![i as f32; 4],
            shape: [1, 2, 2],
            label: i % 3,
        })
        .collect();
    let source = crate::BurnDataset(InMemDataset::new(items));
    let mut loader = DataLoader::builder(source)
        .batch_size(4)
        .num_workers(2)
        .build();
    let batches: Vec<_> = loader.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 3);
    let labels = batches[2]
        .labels
        .clone()
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .unwrap();
    assert_eq!(labels, vec![8 % 3, 9 % 3]);
    assert_eq!(
        batches[1]
            .images
            .clone()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()[0],
        4.0
    );
}

/// A source that takes far longer than the loader is allowed to wait.
struct Stuck;

impl ImageSource for Stuck {
    fn len(&self) -> usize {
        4
    }
    fn get(&self, _index: usize) -> Result<ImageItem, DataError> {
        std::thread::sleep(Duration::from_secs(1));
        Ok(ImageItem {
            pixels: vec![0.0; 4],
            shape: [1, 2, 2],
            label: 0,
        })
    }
}

#[test]
fn a_stuck_worker_is_a_timeout_error_not_a_hang() {
    let start = Instant::now();
    let mut loader = DataLoader::builder(Stuck)
        .batch_size(2)
        .num_workers(1)
        .timeout(Duration::from_millis(200))
        .build();
    let first = loader.epoch(0).next().unwrap();
    assert!(
        matches!(
            first,
            Err(DataError::Timeout {
                worker: 0,
                batch: 0,
                ..
            })
        ),
        "{first:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn unusable_settings_are_errors_from_try_build() {
    let data = || SyntheticImages::new(8, 2, 1, [1, 2, 2]);
    for (builder, what) in [
        (DataLoader::builder(data()).batch_size(0), "batch_size"),
        (DataLoader::builder(data()).prefetch(0), "prefetch"),
        (DataLoader::builder(data()).shard(2, 2), "rank 2"),
    ] {
        let message = builder.try_build().err().expect("refused").to_string();
        assert!(message.contains(what), "{what}: {message}");
    }
    assert!(
        DataLoader::builder(data())
            .batch_size(3)
            .try_build()
            .is_ok()
    );
}
