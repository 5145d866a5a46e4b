//! `RunOptions`: the combinations refused, where a run resumes, and what its directory gets.

use std::path::PathBuf;

use burn::nn::{Linear, LinearConfig};
use burn::optim::SgdConfig;
use burn::tensor::Device;
use kiln_train::TrainPosition;

use crate::{CheckpointError, ResumeFrom, RunIdentity, RunOptions};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-run-options-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

fn with_dir(dir: &std::path::Path) -> RunOptions {
    RunOptions {
        run_dir: Some(dir.to_path_buf()),
        checkpoint_every: Some(2),
        ..RunOptions::default()
    }
}

/// How many times `options` runs an attempt that always fails (it must end with the error).
fn attempts_of_a_failing_run(options: &RunOptions) -> usize {
    let mut attempts = 0;
    let result: Result<(), CheckpointError> = options.with_restarts(None, |_| {
        attempts += 1;
        Err(CheckpointError::Options {
            reason: "failed".into(),
        })
    });
    assert!(result.is_err());
    attempts
}

#[test]
fn options_that_would_be_ignored_are_refused_by_name() {
    let refused = |options: RunOptions, flag: &str| {
        let err = options.check().expect_err(flag);
        assert!(matches!(err, CheckpointError::Options { .. }), "{err}");
        assert!(err.to_string().contains(flag), "{flag}: {err}");
    };
    let dir = PathBuf::from("runs/a");
    refused(
        RunOptions {
            checkpoint_every: Some(4),
            ..RunOptions::default()
        },
        "--checkpoint-every needs --run-dir",
    );
    refused(
        RunOptions {
            resume: Some(ResumeFrom::Latest),
            ..RunOptions::default()
        },
        "--resume latest needs --run-dir",
    );
    refused(
        RunOptions {
            run_dir: Some(dir.clone()),
            max_restarts: 2,
            ..RunOptions::default()
        },
        "--max-restarts needs",
    );
    refused(
        RunOptions {
            keep: 0,
            ..with_dir(&dir)
        },
        "--keep",
    );
    refused(
        RunOptions {
            checkpoint_every: Some(0),
            ..with_dir(&dir)
        },
        "--checkpoint-every must be",
    );
    RunOptions::default().check().unwrap();
    RunOptions {
        max_restarts: 2,
        resume: Some(ResumeFrom::Latest),
        ..with_dir(&dir)
    }
    .check()
    .unwrap();
    // A directory without an interval saves once, at the end: allowed.
    RunOptions {
        run_dir: Some(dir),
        ..RunOptions::default()
    }
    .check()
    .unwrap();
}

#[test]
fn a_run_resumes_its_latest_checkpoint_and_a_fresh_one_refuses_the_occupied_directory() {
    let dir = scratch("resume");
    let options = RunOptions {
        resume: Some(ResumeFrom::Latest),
        ..with_dir(&dir)
    };
    assert_eq!(options.resume_from().unwrap(), None, "nothing saved yet");
    let device = Device::flex().autodiff();
    let model: Linear = LinearConfig::new(3, 2).init(&device);
    let saver = options
        .checkpointer(&RunIdentity::new("linear"))
        .expect("a directory");
    let position = TrainPosition {
        step: 2,
        epoch: 0,
        step_in_epoch: 2,
    };
    let saved = saver
        .save_now(&position, &model, &SgdConfig::new().init())
        .unwrap();
    assert!(
        saved.starts_with(dir.join("checkpoints")),
        "{}",
        saved.display()
    );
    assert_eq!(options.resume_from().unwrap(), Some(saved.clone()));
    let fresh = RunOptions {
        resume: None,
        ..options.clone()
    };
    let err = fresh.resume_from().unwrap_err().to_string();
    assert!(err.contains("--resume latest continues it"), "{err}");
    let named = RunOptions {
        resume: Some(ResumeFrom::Path(saved.clone())),
        ..options
    };
    assert_eq!(named.resume_from().unwrap(), Some(saved));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn without_a_directory_nothing_is_saved_logged_or_restarted() {
    let options = RunOptions::default();
    assert!(options.store().is_none());
    assert!(options.checkpointer(&RunIdentity::new("m")).is_none());
    assert!(
        options
            .run_log(&TrainPosition::default())
            .unwrap()
            .is_none()
    );
    assert!(options.stop_on_sigterm().unwrap().is_none());
    options.record("config.txt", "x").unwrap();
    assert_eq!(
        attempts_of_a_failing_run(&options),
        1,
        "no directory, no restart"
    );
}

#[test]
fn a_failed_attempt_restarts_up_to_the_limit_and_the_directory_gets_its_records() {
    let dir = scratch("restarts");
    let options = RunOptions {
        max_restarts: 2,
        ..with_dir(&dir)
    };
    assert_eq!(
        attempts_of_a_failing_run(&options),
        3,
        "the first and two restarts"
    );
    options.record("config.txt", "lr 0.1\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("config.txt")).unwrap(),
        "lr 0.1\n"
    );
    assert!(
        options
            .run_log(&TrainPosition::default())
            .unwrap()
            .is_some()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn restarts_across_processes_and_checkpoints_of_unsaveable_state_are_refused() {
    let dir = scratch("refusals");
    let restarting = RunOptions {
        max_restarts: 1,
        ..with_dir(&dir)
    };
    let err = restarting.check_processes(true).unwrap_err().to_string();
    assert!(err.contains("launch --max-restarts"), "{err}");
    assert!(restarting.check_processes(false).is_ok());
    let err = with_dir(&dir)
        .refuse_checkpoints("local SGD", "replicas differ")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("do not support local SGD yet: replicas differ"),
        "{err}"
    );
    let logging = RunOptions {
        run_dir: Some(dir.clone()),
        ..RunOptions::default()
    };
    let note = logging
        .refuse_checkpoints("local SGD", "replicas differ")
        .unwrap();
    assert!(note.is_some_and(|note| note.contains("no checkpoint is saved")));
    assert_eq!(
        RunOptions::default().refuse_checkpoints("x", "y").unwrap(),
        None
    );
}
