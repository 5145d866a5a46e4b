//! Where a run starts and how it restarts: a fresh run refused in an occupied store, the
//! latest whole checkpoint found past a corrupted newer one, restarts from the newest
//! checkpoint each failed attempt left, and the last error once the restarts are spent.

use std::path::PathBuf;

use burn::nn::{Linear, LinearConfig};
use burn::optim::SgdConfig;
use burn::tensor::Device;
use kiln_train::TrainPosition;

use crate::{CheckpointError, CheckpointStore, Checkpointer, Restarts, ResumeFrom, RunIdentity};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-restart-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Saves a checkpoint of a small model at `step` into `store`'s directory.
fn save(dir: &std::path::Path, step: usize) -> PathBuf {
    let device = Device::flex().autodiff();
    let model: Linear =
        kiln_core::init_module(&device, 1, || LinearConfig::new(4, 2).init(&device));
    let saver = Checkpointer::new(
        CheckpointStore::new(dir, 10),
        100,
        RunIdentity::new("linear"),
    );
    let position = TrainPosition {
        step,
        epoch: 0,
        step_in_epoch: step,
    };
    saver
        .save_now(&position, &model, &SgdConfig::new().init())
        .unwrap()
}

#[test]
fn a_fresh_run_is_refused_where_checkpoints_are_and_latest_skips_a_corrupted_one() {
    let dir = scratch("resolve");
    let store = CheckpointStore::new(&dir, 10);
    assert_eq!(ResumeFrom::Fresh.resolve(Some(&store)).unwrap(), None);
    assert_eq!(
        ResumeFrom::Latest.resolve(Some(&store)).unwrap(),
        None,
        "nothing yet: fresh"
    );
    assert!(matches!(
        ResumeFrom::Latest.resolve(None),
        Err(CheckpointError::Missing { .. })
    ));
    let older = save(&dir, 2);
    let newer = save(&dir, 4);
    let err = ResumeFrom::Fresh.resolve(Some(&store)).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Occupied { latest, .. } if *latest == newer),
        "{err}"
    );
    assert_eq!(
        ResumeFrom::Latest.resolve(Some(&store)).unwrap(),
        Some(newer.clone())
    );
    // A file of the newest changed on disk: the one before it is the latest whole.
    let model = newer.join(crate::MODEL_FILE);
    let mut bytes = std::fs::read(&model).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&model, bytes).unwrap();
    assert_eq!(
        ResumeFrom::Latest.resolve(Some(&store)).unwrap(),
        Some(older)
    );
    let named = ResumeFrom::Path(newer.clone());
    assert_eq!(
        named.resolve(None).unwrap(),
        Some(newer),
        "a named one is taken as named"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[derive(Debug, PartialEq)]
struct Failed(String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<CheckpointError> for Failed {
    fn from(err: CheckpointError) -> Self {
        Failed(err.to_string())
    }
}

#[test]
fn each_restart_resumes_from_the_newest_checkpoint_and_the_last_error_ends_the_run() {
    let dir = scratch("run");
    let store = CheckpointStore::new(&dir, 10);
    let start = Some(PathBuf::from("where-it-started"));
    // Attempt 1 saves step 2 and fails; attempt 2 saves nothing and fails; attempt 3 works.
    let mut seen = Vec::new();
    let result = Restarts::new(&store, 2).run(start.clone(), |from| {
        seen.push(from.map(|p| p.to_path_buf()));
        match seen.len() {
            1 => {
                save(&dir, 2);
                Err(Failed("replica 1 failed".into()))
            }
            2 => Err(Failed("replica 0 failed".into())),
            _ => Ok(seen.len()),
        }
    });
    assert_eq!(result, Ok(3));
    let step2 = Some(store.path_for(2));
    assert_eq!(seen, vec![start.clone(), step2.clone(), step2]);
    // Restarts spent: the last attempt's error.
    let mut attempts = 0;
    let result: Result<(), Failed> = Restarts::new(&store, 1).run(start, |_| {
        attempts += 1;
        Err(Failed(format!("attempt {attempts} failed")))
    });
    assert_eq!(result, Err(Failed("attempt 2 failed".into())));
    // No restarts: the first error as it is.
    let result: Result<(), Failed> =
        Restarts::new(&store, 0).run(None, |_| Err(Failed("once".into())));
    assert_eq!(result, Err(Failed("once".into())));
    std::fs::remove_dir_all(&dir).ok();
}
