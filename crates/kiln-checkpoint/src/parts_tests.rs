//! Writes that fail or wait: a full disk, parts other replicas write (ZeRO-1 shards: a
//! checkpoint counts only once all are in it); and the model's bytes are Burn's own format.

use std::path::Path;
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::Device;

use crate::tests::{identity, model, optimizer, saved, scratch, train, train_into};
use crate::{CheckpointStore, resume};

#[test]
fn a_checkpoint_counts_only_once_every_replicas_part_is_in_it() {
    use std::sync::Arc;
    let (dir, store) = saved("parts", 1, 5);
    let manifest = crate::Manifest::read(&store.path_for(1)).unwrap();
    let at = |step: usize| crate::Manifest {
        position: crate::Position {
            step,
            ..manifest.position
        },
        ..manifest.clone()
    };
    let parts = |timeout_ms: u64| crate::PartsToCollect {
        names: vec!["optimizer-1-of-2.bpk".into()],
        timeout: Duration::from_millis(timeout_ms),
        abandoned: Arc::default(),
    };
    // A part that never comes (its replica lost): an error in bounded time, nothing counts.
    let begun = Instant::now();
    let err = store
        .save_with_parts(at(2), vec![("a".into(), vec![1])], Some(&parts(200)))
        .unwrap_err();
    assert!(begun.elapsed() < Duration::from_secs(10));
    assert!(
        err.to_string().contains("optimizer-1-of-2.bpk") && err.to_string().contains("within"),
        "{err}"
    );
    assert_eq!(store.latest().unwrap(), Some(store.path_for(1)));
    // A replica that could not write its part says so, and the wait ends at once.
    store
        .clone()
        .with_space_left(0)
        .save_part(3, "optimizer-1-of-2.bpk", &[7; 16])
        .unwrap_err();
    let begun = Instant::now();
    let err = store
        .save_with_parts(at(3), vec![("a".into(), vec![1])], Some(&parts(60_000)))
        .unwrap_err();
    assert!(
        begun.elapsed() < Duration::from_secs(10),
        "waited for a failed part"
    );
    assert!(err.to_string().contains("No space left"), "{err}");
    // The part written (before or while the writer waits) is moved in and checksummed.
    let writer = {
        let (store, manifest, parts) = (store.clone(), at(4), parts(60_000));
        std::thread::spawn(move || {
            store.save_with_parts(manifest, vec![("a".into(), vec![1])], Some(&parts))
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    store
        .save_part(4, "optimizer-1-of-2.bpk", &[7; 16])
        .unwrap();
    let saved = writer.join().unwrap().unwrap();
    let loaded = CheckpointStore::load(&saved).unwrap();
    assert_eq!(loaded.file("optimizer-1-of-2.bpk").unwrap(), &[7; 16]);
    let hidden: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".parts-step-000000004"))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn model_bytes_are_what_burnpack_store_writes() {
    use burn_store::{BurnpackStore, ModuleSnapshot};
    let device = Device::flex().autodiff();
    let model = model(&device);
    let mut store = BurnpackStore::from_bytes(None);
    model.valid().save_into(&mut store).unwrap();
    let want = store.get_bytes().unwrap();
    assert_eq!(crate::model_bytes(&model), &want[..]);
}

/// The bytes of a checkpoint directory's files.
fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn a_full_disk_during_a_save_stops_the_run_with_the_reason_and_keeps_the_previous_checkpoint() {
    let dir = scratch("full");
    let (_, whole) = train(&dir, None);
    let step5 = bytes_in(&CheckpointStore::new(&dir, 10).path_for(5));
    // Room for the first checkpoint (step 5) and half of the second.
    let full = scratch("full-disk");
    let store = CheckpointStore::new(&full, 10).with_space_left(step5 + step5 / 2);
    let err = train_into(store.clone(), None, None).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("No space left on device") && message.contains("step-000000010"),
        "{message}"
    );
    assert_eq!(store.list().unwrap(), vec![(5, store.path_for(5))]);
    let leftovers: Vec<_> = std::fs::read_dir(&full)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(
        leftovers.is_empty(),
        "partial directories left: {leftovers:?}"
    );
    // The checkpoint kept is whole: the run resumed from it ends as the uninterrupted one.
    let device = Device::flex().autodiff();
    let resumed = resume(&store.path_for(5), &identity(), model(&device), optimizer()).unwrap();
    let again = scratch("full-resumed");
    let (_, weights) = train(
        &again,
        Some((resumed.model, resumed.optimizer, resumed.position)),
    );
    assert_eq!(weights, whole);
    for d in [dir, full, again] {
        std::fs::remove_dir_all(&d).ok();
    }
}

/// A collector polling for a failure note while it is written reads all of it: the note is
/// renamed into place whole (it was written in place, and a collector once read it empty;
/// on that code this test failed at its first step, 3 runs of 3).
#[test]
fn a_failure_note_is_read_whole_while_it_is_written() {
    use std::sync::Arc;
    let (dir, store) = saved("note", 1, 5);
    let manifest = crate::Manifest::read(&store.path_for(1)).unwrap();
    let reason = format!("{}the end", "a long reason, ".repeat(1 << 16));
    for step in 2..6 {
        let manifest = crate::Manifest {
            position: crate::Position {
                step,
                ..manifest.position
            },
            ..manifest.clone()
        };
        let parts = crate::PartsToCollect {
            names: vec!["optimizer-1-of-2.bpk".into()],
            timeout: Duration::from_secs(60),
            abandoned: Arc::default(),
        };
        let writer = {
            let (store, reason) = (store.clone(), reason.clone());
            // Written again and again, so that the collector's first look falls during a write.
            std::thread::spawn(move || {
                for _ in 0..200 {
                    store.note_part_failure(step, "optimizer-1-of-2.bpk", &reason);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(5));
        let err = store
            .save_with_parts(manifest, vec![("a".into(), vec![1])], Some(&parts))
            .unwrap_err()
            .to_string();
        writer.join().unwrap();
        assert!(
            err.ends_with("the end"),
            "step {step}: the note was read half written"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}
