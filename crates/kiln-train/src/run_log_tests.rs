//! A run directory's log: one line per step and epoch, curves redrawn, resumed runs continue.

use std::time::Duration;

use crate::{EpochSummary, RunLog, StepRecord, TrainObserver};

fn step(step: usize, epoch: usize) -> StepRecord {
    StepRecord {
        epoch,
        step,
        loss: 2.0 / (step + 1) as f32,
        accuracy: 0.1 * epoch as f32,
        lr: 0.1,
        images_per_sec: 100.0,
        data_wait: Duration::from_millis(1),
        // Mixed precision's scale from step 2 on (f32 before: no scale, no field).
        loss_scale: (step >= 2).then_some(65536.0),
    }
}

fn epoch(epoch: usize) -> EpochSummary {
    EpochSummary {
        epoch,
        train_loss: 1.0,
        train_accuracy: 0.5,
        valid_loss: Some(0.9),
        valid_accuracy: Some(0.6),
        images_per_sec: 100.0,
        elapsed: Duration::from_secs(1),
        data_wait: Duration::from_millis(8),
    }
}

/// Logs `epochs` epochs of 4 steps from step `first`.
fn log(dir: &std::path::Path, first: usize, epochs: std::ops::Range<usize>) {
    let mut log = RunLog::open(dir, first).unwrap();
    let mut s = first;
    for e in epochs {
        while s < (e + 1) * 4 {
            log.on_step(&step(s, e)).unwrap();
            s += 1;
        }
        log.on_epoch(&epoch(e)).unwrap();
    }
}

fn lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_step_and_epoch_is_a_line_and_the_curves_are_redrawn() {
    let dir = std::env::temp_dir().join(format!("kiln-runlog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    log(&dir, 0, 0..3);
    let all = lines(&dir);
    assert_eq!(all.len(), 3 * 4 + 3);
    assert_eq!(all[0]["step"], 0);
    assert!(all[0].get("loss_scale").is_none(), "no scale without one");
    assert_eq!(all[2]["loss_scale"], 65536.0);
    assert_eq!(all[4]["epoch_end"], 4);
    assert_eq!(
        all[4]["valid_accuracy"]
            .as_f64()
            .map(|v| (v * 10.0).round()),
        Some(6.0)
    );
    let svg = std::fs::read_to_string(dir.join("curves.svg")).unwrap();
    for title in [
        ">loss</text>",
        ">accuracy</text>",
        ">learning rate</text>",
        ">validation</text>",
    ] {
        assert!(svg.contains(title), "{title}");
    }
    // A run resumed at step 6 (mid-epoch 1) keeps what came before it and drops what a
    // crashed run logged after its checkpoint, then continues.
    log(&dir, 6, 1..3);
    let all = lines(&dir);
    let steps: Vec<u64> = all.iter().filter_map(|l| l["step"].as_u64()).collect();
    assert_eq!(
        steps,
        (0..12).collect::<Vec<_>>(),
        "each step once, in order"
    );
    let epochs: Vec<u64> = all.iter().filter_map(|l| l["epoch_end"].as_u64()).collect();
    assert_eq!(epochs, vec![4, 8, 12]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_unwritable_directory_is_an_error_naming_it() {
    let file = std::env::temp_dir().join(format!("kiln-runlog-file-{}", std::process::id()));
    std::fs::write(&file, b"not a directory").unwrap();
    let err = RunLog::open(&file, 0).unwrap_err();
    assert!(err.to_string().contains("kiln-runlog-file"), "{err}");
    std::fs::remove_file(&file).ok();
}
