//! Stage parts written by pipeline stages in other processes: a part file round-trips and is
//! refused when damaged; parts on disk join into the very checkpoint one process writes; a
//! part that is missing or could not be written is an error naming it, in bounded time,
//! and nothing counts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::{Bytes, DType};
use burn_pack::Writer;
use kiln_train::TrainPosition;

use crate::tests::scratch;
use crate::{CheckpointStore, Checkpointer, RunIdentity, StagePart, stage_part_name};

/// A stage's part holding `tensors` (`(name, elements)`; 0 elements: emptied, another
/// stage's), optimizer bytes and ids of its own.
fn part(tensors: &[(&str, usize)], seed: u8) -> StagePart {
    let tensors = tensors
        .iter()
        .map(|&(name, elements)| {
            let values: Vec<u8> = (0..elements * 4)
                .map(|i| seed.wrapping_add(i as u8))
                .collect();
            burn_pack::Tensor::new(
                name.into(),
                DType::F32,
                [elements],
                None,
                Bytes::from_bytes_vec(values),
            )
        })
        .collect();
    StagePart {
        model: crate::snapshot::encode(Writer::new(tensors)).unwrap(),
        optimizer: vec![seed; 32],
        ids: BTreeMap::from([(format!("stage{seed}.weight"), u64::from(seed))]),
        step_state: serde_json::json!({ "scale": 1024.0 }),
    }
}

/// The two stages' parts of a two-stage pipeline.
fn parts() -> [StagePart; 2] {
    [
        part(&[("a", 3), ("b", 0)], 1),
        part(&[("a", 0), ("b", 5)], 2),
    ]
}

fn checkpointer(dir: &Path) -> Checkpointer {
    Checkpointer::new(
        CheckpointStore::new(dir, 3),
        2,
        RunIdentity::new("two stages"),
    )
}

const AT: TrainPosition = TrainPosition {
    step: 2,
    epoch: 0,
    step_in_epoch: 2,
};

#[test]
fn a_stage_part_file_round_trips_and_damage_is_refused_with_the_file_named() {
    let [first, _] = parts();
    let bytes = first.to_bytes();
    let back = StagePart::from_bytes(&bytes, Path::new("p")).unwrap();
    assert_eq!(
        (&back.model, &back.optimizer, &back.ids, &back.step_state),
        (
            &first.model,
            &first.optimizer,
            &first.ids,
            &first.step_state
        )
    );
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 1;
    for (damaged, reason) in [
        (&bytes[..bytes.len() - 3], "truncated"),
        (&flipped[..], "checksum"),
        (&b"something else"[..], "not a pipeline stage's part"),
    ] {
        let err = StagePart::from_bytes(damaged, Path::new("dir/stage-1-of-2.part")).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("stage-1-of-2.part") && message.contains(reason),
            "{message}"
        );
    }
}

#[test]
fn parts_from_other_processes_join_into_the_checkpoint_one_process_writes() {
    let (one, across) = (scratch("stages-one"), scratch("stages-across"));
    let [first, second] = parts();
    let in_one = checkpointer(&one).stage_writer(&AT)(vec![first.clone(), second.clone()]).unwrap();
    // Stage 1 writes its part a little after stage 0's writer began to wait for it.
    let saver = checkpointer(&across).stage_part_writer(&AT, 1, 2);
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        saver(second)
    });
    let collect = checkpointer(&across).stage_writer_collecting(
        &AT,
        2,
        Duration::from_secs(30),
        Arc::default(),
    );
    let written = collect(first).unwrap();
    assert_eq!(
        late.join().unwrap().unwrap(),
        written,
        "both name the checkpoint"
    );
    let files = |dir: &Path| -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(entry.path()).unwrap())
            })
            .collect()
    };
    let (a, b) = (files(&in_one), files(&written));
    assert!(a.contains_key("optimizer-1-of-2.bpk"), "{:?}", a.keys());
    assert_eq!(a, b, "the same files, byte for byte (the manifest too)");
    // The part was taken: nothing is left waiting in the store.
    let left: Vec<_> = std::fs::read_dir(&across)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![written.file_name().unwrap().to_owned()]);
    let loaded = CheckpointStore::load(&written).unwrap();
    assert_eq!(
        loaded.manifest.optimizer.len(),
        2,
        "one optimizer part per stage"
    );
    for dir in [one, across] {
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_missing_or_failed_stage_part_is_an_error_naming_it_and_nothing_counts() {
    let dir = scratch("stages-missing");
    let [first, second] = parts();
    let collect = |timeout: Duration, abandoned: Arc<AtomicBool>| {
        checkpointer(&dir).stage_writer_collecting(&AT, 2, timeout, abandoned)
    };
    // Stage 1's process lost: an error naming its part after the timeout.
    let begun = Instant::now();
    let err = collect(Duration::from_millis(200), Arc::default())(first.clone()).unwrap_err();
    assert!(begun.elapsed() < Duration::from_secs(10));
    let name = stage_part_name(1, 2);
    assert!(
        err.to_string().contains(&name) && err.to_string().contains("within"),
        "{err}"
    );
    // The run abandoned (a stage failed): the wait ends at once.
    let abandoned = Arc::new(AtomicBool::new(false));
    abandoned.store(true, Ordering::Release);
    let begun = Instant::now();
    let err = collect(Duration::from_secs(60), abandoned)(first.clone()).unwrap_err();
    assert!(begun.elapsed() < Duration::from_secs(10));
    assert!(err.to_string().contains("abandoned"), "{err}");
    // Stage 1 could not write its part (a full disk): it says so and the wait ends at once.
    let full = Checkpointer::new(
        CheckpointStore::new(&dir, 3).with_space_left(0),
        2,
        RunIdentity::new("two stages"),
    );
    let err = full.stage_part_writer(&AT, 1, 2)(second).unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    let begun = Instant::now();
    let err = collect(Duration::from_secs(60), Arc::default())(first).unwrap_err();
    assert!(
        begun.elapsed() < Duration::from_secs(10),
        "waited for a failed part"
    );
    assert!(err.to_string().contains("No space left"), "{err}");
    assert_eq!(CheckpointStore::new(&dir, 3).latest().unwrap(), None);
    std::fs::remove_dir_all(dir).ok();
}
