//! Checkpoints across processes, without MPI: "processes" are threads, each with its rank
//! of an in-process world. Each writes its own stage's part and rank 0 joins them into the
//! very checkpoint one process writes; a write that fails on one rank, a rank that cannot
//! read the checkpoint, or ranks that would start at different steps are errors on every
//! rank, in bounded time. And in one process: a stage's part of the next checkpoint that
//! arrives before a slower stage's part of this one waits for its own write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::tensor::Device;
use crossbeam_channel::unbounded;
use kiln_checkpoint::{CheckpointStore, Checkpointer, RunIdentity, StagePart};
use kiln_comm::{Communicator, InProcessGroup};
use kiln_core::Segmented;
use kiln_train::{StepState, TrainPosition};

use crate::runtime::PipelineError;
use crate::runtime::checkpoint::{Writes, agree, agree_start, collect, hand_over};
use crate::runtime::stage::Stage;
use crate::runtime::test_support::{resnet, sgd};
use crate::runtime::tied::StageTies;

const AT: TrainPosition = TrainPosition {
    step: 2,
    epoch: 0,
    step_in_epoch: 2,
};
const TIMEOUT: Duration = Duration::from_secs(30);

/// The parts of a two-stage pipeline of the test ResNet: each stage built on its own, the
/// other stage's parameters emptied, handed over as a stage does at a checkpoint step.
fn stage_parts() -> Vec<StagePart> {
    let device = Device::flex().autodiff();
    let (sender, receiver) = unbounded();
    for index in 0..2 {
        let model = resnet(&device, 5);
        let segments = model.segments().len();
        let half = segments / 2;
        let chunks = if index == 0 { 0..half } else { half..segments };
        let stage = Stage::new(model, vec![chunks], StageTies::default());
        hand_over(
            index,
            AT.step,
            (&stage.model, &sgd(), StepState::Null),
            &stage.owned_ids,
            &sender,
        );
    }
    let mut parts: Vec<(usize, StagePart)> = (0..2)
        .map(|_| {
            let (stage, _, part) = receiver.recv_timeout(TIMEOUT).unwrap();
            (stage, part.unwrap())
        })
        .collect();
    parts.sort_by_key(|(stage, _)| *stage);
    parts.into_iter().map(|(_, part)| part).collect()
}

fn checkpointer(store: CheckpointStore) -> Checkpointer {
    Checkpointer::new(store, 2, RunIdentity::new("resnet18 width 2 in two stages"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-pp-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(entry.path()).unwrap())
        })
        .collect()
}

/// Each rank of a two-rank world writes the checkpoint at `AT` with its stage's part into
/// `stores[rank]`; every rank's outcome.
fn write_across(
    parts: &[StagePart],
    stores: [CheckpointStore; 2],
) -> Vec<Result<Option<PathBuf>, PipelineError>> {
    let worlds = InProcessGroup::new(2).timeout(TIMEOUT).build();
    std::thread::scope(|scope| {
        let handles: Vec<_> = worlds
            .into_iter()
            .zip(stores)
            .zip(parts.iter().cloned())
            .map(|((world, store), part)| {
                scope.spawn(move || {
                    let (sender, receiver) = unbounded();
                    let rank = world.rank();
                    let _ = sender.send((rank, AT.step, Ok(part)));
                    let mut writes =
                        Writes::new(receiver, 2, TIMEOUT).across(&world, Arc::default());
                    writes.start(&checkpointer(store), &AT)?;
                    writes.wait()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn stages_in_other_processes_write_the_checkpoint_one_process_writes() {
    let parts = stage_parts();
    let (one, across) = (scratch("one"), scratch("across"));
    let (sender, receiver) = unbounded();
    for (stage, part) in parts.iter().cloned().enumerate() {
        sender.send((stage, AT.step, Ok(part))).unwrap();
    }
    let mut writes = Writes::new(receiver, 2, TIMEOUT);
    writes
        .start(&checkpointer(CheckpointStore::new(&one, 3)), &AT)
        .unwrap();
    let in_one = writes.wait().unwrap().unwrap();
    let store = CheckpointStore::new(&across, 3);
    let outcomes = write_across(&parts, [store.clone(), store]);
    let written = outcomes[0].as_ref().unwrap().clone().unwrap();
    assert_eq!(outcomes[1].as_ref().unwrap().as_ref(), Some(&written));
    assert_eq!(
        files(&in_one),
        files(&written),
        "the same files, byte for byte"
    );
    for dir in [one, across] {
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_write_that_fails_in_one_process_is_an_error_in_every_one() {
    let parts = stage_parts();
    let dir = scratch("full");
    // Rank 1's disk is full: its part cannot be written.
    let stores = [
        CheckpointStore::new(&dir, 3),
        CheckpointStore::new(&dir, 3).with_space_left(0),
    ];
    let outcomes = write_across(&parts, stores);
    for (rank, outcome) in outcomes.iter().enumerate() {
        let err = outcome.as_ref().expect_err("every rank fails").to_string();
        assert!(err.contains("No space left"), "rank {rank}: {err}");
    }
    assert_eq!(CheckpointStore::new(&dir, 3).latest().unwrap(), None);
    std::fs::remove_dir_all(dir).ok();
}

/// Runs `each(rank, world)` on the ranks of a world of `size`; every rank's result.
fn on_ranks<T: Send>(size: usize, each: impl Fn(usize, &Communicator) -> T + Sync) -> Vec<T> {
    let worlds = InProcessGroup::new(size).timeout(TIMEOUT).build();
    std::thread::scope(|scope| {
        let each = &each;
        let handles: Vec<_> = worlds
            .into_iter()
            .map(|world| scope.spawn(move || each(world.rank(), &world)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn one_ranks_failure_is_every_ranks_and_ranks_start_at_the_same_step() {
    let outcomes = on_ranks(3, |rank, world| {
        let outcome = if rank == 1 {
            Err(PipelineError::checkpoint("rank 1's own reason"))
        } else {
            Ok(())
        };
        agree(world, outcome)
    });
    let messages: Vec<String> = outcomes
        .iter()
        .map(|o| o.as_ref().unwrap_err().to_string())
        .collect();
    assert!(messages[1].contains("rank 1's own reason"), "{messages:?}");
    for rank in [0, 2] {
        assert!(messages[rank].contains("process 1"), "{messages:?}");
    }
    // A rank that cannot read the checkpoint, or one at another step: every rank refuses.
    let position = |step| TrainPosition {
        step,
        ..TrainPosition::default()
    };
    let unreadable = on_ranks(2, |rank, world| {
        let start = if rank == 0 {
            Ok(position(4))
        } else {
            Err(PipelineError::checkpoint("no manifest"))
        };
        agree_start(world, None, start)
    });
    assert!(unreadable.iter().all(Result::is_err), "{unreadable:?}");
    let apart = on_ranks(2, |rank, world| {
        agree_start(world, None, Ok(position(if rank == 0 { 4 } else { 2 })))
    });
    for outcome in &apart {
        let err = outcome.as_ref().unwrap_err().to_string();
        assert!(err.contains("different steps (2 to 4)"), "{err}");
    }
    let together = on_ranks(2, |_, world| agree_start(world, None, Ok(position(4))));
    assert!(
        together
            .iter()
            .all(|o| o.as_ref().is_ok_and(|p| p.step == 4))
    );
}

#[test]
fn a_part_of_the_next_checkpoint_that_arrives_first_waits_for_its_write() {
    let parts = stage_parts();
    let (sender, receiver) = unbounded();
    // Stage 0 hands over its parts of steps 2 and 4 before stage 1's encoder of step 2 ends.
    for (stage, step) in [(0, 2), (0, 4), (1, 2), (1, 4)] {
        sender
            .send((stage, step, Ok(parts[stage].clone())))
            .unwrap();
    }
    let early = Mutex::default();
    for step in [2, 4] {
        let got = collect(&[0, 1], step, (&receiver, &early), TIMEOUT).unwrap();
        let ids: Vec<_> = got.iter().map(|p| &p.ids).collect();
        assert_eq!(ids, vec![&parts[0].ids, &parts[1].ids], "step {step}");
    }
    assert!(early.lock().unwrap().is_empty());
}
