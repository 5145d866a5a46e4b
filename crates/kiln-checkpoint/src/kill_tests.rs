//! Processes killed while saving or pruning: the checkpoints listed afterwards are whole.
//!
//! Each test runs this test binary again as a child (an `#[ignore]`d test that saves
//! checkpoints into `KILN_CHECKPOINT_CHILD_DIR`) and stops it: by SIGKILL at a varying moment,
//! or exactly at a failpoint (`KILN_CHECKPOINT_FAILPOINT`, see `store.rs`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burn::nn::{Linear, LinearConfig};
use burn::optim::SgdConfig;
use burn::tensor::Device;
use kiln_core::{fingerprint, init_module};
use kiln_train::TrainPosition;

use crate::tests::scratch;
use crate::{CheckpointStore, Checkpointer, RunIdentity, resume};

/// This test binary running only the ignored child test `name`, saving into `dir`, its
/// output discarded.
fn child(name: &str, dir: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", &format!("kill_tests::{name}")])
        .env("KILN_CHECKPOINT_CHILD_DIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Not a test on its own: the child process of the kill test, saving checkpoints in a loop
/// until it is killed.
#[test]
#[ignore = "runs as the child of a_kill_during_a_save_leaves_the_previous_checkpoints_intact"]
fn child_saving_checkpoints_until_killed() {
    let Some(dir) = std::env::var_os("KILN_CHECKPOINT_CHILD_DIR") else {
        return;
    };
    let device = Device::flex().autodiff();
    // 4 MB of weights: a save takes long enough to be killed in the middle.
    let big: Linear = init_module(&device, 1, || LinearConfig::new(1024, 1024).init(&device));
    let saver = Checkpointer::new(CheckpointStore::new(dir, 2), 1, RunIdentity::new("big"));
    for step in 1.. {
        let position = TrainPosition {
            step,
            ..TrainPosition::default()
        };
        saver
            .save_now(&position, &big, &SgdConfig::new().init())
            .unwrap();
    }
}

#[test]
fn a_kill_during_a_save_leaves_the_previous_checkpoints_intact() {
    let dir = scratch("kill");
    let store = CheckpointStore::new(&dir, 2);
    let device = Device::flex().autodiff();
    let big: Linear = init_module(&device, 1, || LinearConfig::new(1024, 1024).init(&device));
    for round in 0..4u64 {
        let mut child = child("child_saving_checkpoints_until_killed", &dir)
            .spawn()
            .unwrap();
        // Wait for a first checkpoint of this round, then kill at a varying moment.
        let deadline = Instant::now() + Duration::from_secs(60);
        let before = store.latest().unwrap();
        while store.latest().unwrap() == before {
            assert!(Instant::now() < deadline, "the child saved nothing in 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(3 + 7 * round));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Every complete checkpoint loads and verifies; the latest resumes.
        for (_, path) in store.list().unwrap() {
            CheckpointStore::load(&path).unwrap();
        }
        let latest = store
            .latest()
            .unwrap()
            .expect("a checkpoint survives the kill");
        let fresh: Linear = init_module(&device, 9, || LinearConfig::new(1024, 1024).init(&device));
        let resumed = resume(
            &latest,
            &RunIdentity::new("big"),
            fresh,
            SgdConfig::new().init(),
        )
        .unwrap();
        assert_eq!(fingerprint(&resumed.model), fingerprint(&big));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "runs as the child of a_kill_at_any_failpoint_leaves_only_whole_checkpoints_listed"]
fn child_saving_until_a_failpoint() {
    let Some(dir) = std::env::var_os("KILN_CHECKPOINT_CHILD_DIR") else {
        return;
    };
    let first: usize = std::env::var("KILN_CHECKPOINT_CHILD_FIRST")
        .unwrap()
        .parse()
        .unwrap();
    let device = Device::flex().autodiff();
    let small: Linear = init_module(&device, 1, || LinearConfig::new(64, 64).init(&device));
    let saver = Checkpointer::new(CheckpointStore::new(dir, 2), 1, RunIdentity::new("small"));
    for step in first..first + 3 {
        let position = TrainPosition {
            step,
            ..TrainPosition::default()
        };
        saver
            .save_now(&position, &small, &SgdConfig::new().init())
            .unwrap();
    }
}

/// A process stopped at each point of a save or a prune (a failpoint aborts it there, so the
/// kill lands exactly) leaves every listed checkpoint whole: each loads and verifies, the
/// latest resumes bit for bit, and the next save clears what was left (a checkpoint moved
/// aside to be replaced comes back). On a prune that deletes in place, `prune-deleting`
/// leaves a listed checkpoint with files missing, and this test fails.
#[test]
fn a_kill_at_any_failpoint_leaves_only_whole_checkpoints_listed() {
    let device = Device::flex().autodiff();
    let small: Linear = init_module(&device, 1, || LinearConfig::new(64, 64).init(&device));
    let child = |dir: &Path, first: usize, failpoint: Option<&str>| {
        let mut command = child("child_saving_until_a_failpoint", dir);
        command.env("KILN_CHECKPOINT_CHILD_FIRST", first.to_string());
        if let Some(point) = failpoint {
            command.env("KILN_CHECKPOINT_FAILPOINT", point);
        }
        command.status().unwrap().success()
    };
    let whole = |store: &CheckpointStore, what: &str| {
        let listed = store.list().unwrap();
        assert!(!listed.is_empty(), "{what}: no checkpoint left");
        for (_, path) in &listed {
            CheckpointStore::load(path).unwrap_or_else(|err| panic!("{what}: {err}"));
        }
        let latest = store
            .latest_whole()
            .unwrap()
            .expect("a checkpoint verifies");
        assert!(
            latest.skipped.is_empty(),
            "{what}: skipped {:?}",
            latest.skipped
        );
        let fresh: Linear = init_module(&device, 9, || LinearConfig::new(64, 64).init(&device));
        let resumed = resume(
            &latest.path,
            &RunIdentity::new("small"),
            fresh,
            SgdConfig::new().init(),
        )
        .unwrap();
        assert_eq!(fingerprint(&resumed.model), fingerprint(&small), "{what}");
        listed
    };
    // Steps 1-3 saved (2 and 3 kept); then a run saving from `first` stops at the point.
    for (point, first) in [
        ("save-written", 4),
        ("save-replaced", 3),
        ("prune-renamed", 4),
        ("prune-deleting", 4),
    ] {
        let dir = scratch(&format!("failpoint-{point}"));
        let store = CheckpointStore::new(&dir, 2);
        assert!(child(&dir, 1, None), "{point}: the first run");
        assert!(
            !child(&dir, first, Some(point)),
            "{point}: the failpoint did not stop the run"
        );
        whole(&store, point);
        // The next save sweeps the leftovers: only checkpoints remain, step 3 among them.
        assert!(child(&dir, 10, None), "{point}: the run after");
        let listed = whole(&store, &format!("{point}, then saved again"));
        assert_eq!(listed.len(), 2, "{point}: {listed:?}");
        let hidden: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(".step-"))
            .collect();
        assert!(hidden.is_empty(), "{point}: left behind {hidden:?}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
