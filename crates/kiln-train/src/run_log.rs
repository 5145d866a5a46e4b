//! A run's log: every step and epoch as a JSON line (`metrics.jsonl`) and the loss, accuracy
//! and learning-rate curves as a picture (`curves.svg`), redrawn after every epoch.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::plot::{Series, line_chart, stacked};
use crate::{EpochSummary, StepRecord, TrainError};

/// Sees what the trainer records, as it records it (see
/// [`TrainerBuilder::observer`](crate::TrainerBuilder::observer)).
pub trait TrainObserver: Send {
    /// After every optimizer step.
    ///
    /// # Errors
    /// Stops training with the error.
    fn on_step(&mut self, step: &StepRecord) -> Result<(), TrainError>;

    /// After every epoch (validation included).
    ///
    /// # Errors
    /// Stops training with the error.
    fn on_epoch(&mut self, epoch: &EpochSummary) -> Result<(), TrainError>;
}

/// Writes `metrics.jsonl` and `curves.svg` into a run directory.
///
/// ```
/// use kiln_train::RunLog;
/// let dir = std::env::temp_dir().join(format!("kiln-runlog-doc-{}", std::process::id()));
/// let _log = RunLog::open(&dir, 0)?; // a fresh run: steps from 0
/// assert!(dir.join("metrics.jsonl").exists());
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), kiln_train::TrainError>(())
/// ```
#[derive(Debug)]
pub struct RunLog {
    dir: PathBuf,
    out: BufWriter<File>,
    steps: Vec<StepPoint>,
    epochs: Vec<EpochPoint>,
}

/// What the curves need of a step.
#[derive(Debug, Clone, Copy)]
struct StepPoint {
    step: f64,
    loss: f64,
    accuracy: f64,
    lr: f64,
}

/// What the curves need of an epoch: the step it ended at, its validation figures.
#[derive(Debug, Clone, Copy)]
struct EpochPoint {
    end: f64,
    loss: Option<f64>,
    accuracy: Option<f64>,
}

const METRICS: &str = "metrics.jsonl";
const CURVES: &str = "curves.svg";

impl RunLog {
    /// Opens the log of a run starting at optimizer step `first_step`: the lines of an
    /// earlier run up to that step are kept (a resumed run continues its curves), later ones
    /// (steps a crashed run did after its last checkpoint) dropped.
    ///
    /// # Errors
    /// [`TrainError::Log`] naming the file that cannot be read or written.
    pub fn open(dir: impl AsRef<Path>, first_step: usize) -> Result<Self, TrainError> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join(METRICS);
        fs::create_dir_all(&dir).map_err(|err| failed(&dir, err))?;
        let earlier = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(err) => return Err(failed(&path, err)),
        };
        let kept: Vec<&str> = earlier
            .lines()
            .filter(|line| {
                let value: Value = serde_json::from_str(line).unwrap_or(Value::Null);
                match (value.get("step"), value.get("epoch_end")) {
                    (Some(step), _) => step.as_u64().is_some_and(|s| (s as usize) < first_step),
                    // An epoch's line stays when the epoch ended by the resume point.
                    (None, Some(last)) => last.as_u64().is_some_and(|s| (s as usize) <= first_step),
                    _ => false,
                }
            })
            .collect();
        // The kept lines go to a new file that replaces the old one whole (renamed over it,
        // once synced): a process killed at any instant leaves the old log or the new one,
        // never a truncated one.
        let partial = dir.join(format!("{METRICS}.partial-{}", std::process::id()));
        let mut text = String::new();
        for line in &kept {
            text.push_str(line);
            text.push('\n');
        }
        File::create(&partial)
            .and_then(|mut file| {
                file.write_all(text.as_bytes())?;
                file.sync_all()
            })
            .map_err(|err| failed(&partial, err))?;
        fs::rename(&partial, &path).map_err(|err| failed(&path, err))?;
        let mut log = Self {
            out: BufWriter::new(
                OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .map_err(|err| failed(&path, err))?,
            ),
            dir,
            steps: Vec::new(),
            epochs: Vec::new(),
        };
        for line in kept {
            log.remember(&serde_json::from_str(line).unwrap_or(Value::Null));
        }
        Ok(log)
    }

    /// Keeps what the curves need of a logged line.
    fn remember(&mut self, line: &Value) {
        let number = |key: &str| line.get(key).and_then(Value::as_f64);
        if let (Some(step), Some(loss), Some(accuracy), Some(lr)) = (
            number("step"),
            number("loss"),
            number("accuracy"),
            number("lr"),
        ) {
            self.steps.push(StepPoint {
                step,
                loss,
                accuracy,
                lr,
            });
        } else if let Some(end) = number("epoch_end") {
            self.epochs.push(EpochPoint {
                end,
                loss: number("valid_loss"),
                accuracy: number("valid_accuracy"),
            });
        }
    }

    fn write(&mut self, line: Value) -> Result<(), TrainError> {
        let path = self.dir.join(METRICS);
        // Flushed line by line: a killed run loses no step it logged.
        writeln!(self.out, "{line}")
            .and_then(|()| self.out.flush())
            .map_err(|err| failed(&path, err))?;
        self.remember(&line);
        Ok(())
    }

    /// Redraws `curves.svg` from everything logged.
    fn draw(&self) -> Result<(), TrainError> {
        // Steps count from 1 on the x axis: step s ends with s + 1 steps done, as an epoch
        // line's `epoch_end` counts them.
        let steps = |pick: fn(&StepPoint) -> f64| -> Vec<(f64, f64)> {
            self.steps.iter().map(|s| (s.step + 1.0, pick(s))).collect()
        };
        let valid = |pick: fn(&EpochPoint) -> Option<f64>| -> Vec<(f64, f64)> {
            self.epochs
                .iter()
                .filter_map(|e| pick(e).map(|v| (e.end, v)))
                .collect()
        };
        let series = |name: &str, points: Vec<(f64, f64)>| Series {
            name: name.into(),
            points,
        };
        let mut loss = vec![series("train", steps(|s| s.loss))];
        let mut accuracy = vec![series("train", steps(|s| s.accuracy))];
        let valid_loss = valid(|e| e.loss);
        if !valid_loss.is_empty() {
            loss.push(series("validation", valid_loss));
            accuracy.push(series("validation", valid(|e| e.accuracy)));
        }
        let svg = stacked(&[
            line_chart("loss", "step", "loss", false, &loss),
            line_chart("accuracy", "step", "accuracy", false, &accuracy),
            line_chart(
                "learning rate",
                "step",
                "lr",
                false,
                &[series("lr", steps(|s| s.lr))],
            ),
        ]);
        let path = self.dir.join(CURVES);
        let partial = self.dir.join(format!("{CURVES}.partial"));
        fs::write(&partial, svg).map_err(|err| failed(&partial, err))?;
        fs::rename(&partial, &path).map_err(|err| failed(&path, err))
    }
}

impl TrainObserver for RunLog {
    fn on_step(&mut self, step: &StepRecord) -> Result<(), TrainError> {
        let mut line = json!({
            "step": step.step,
            "epoch": step.epoch,
            "loss": step.loss,
            "accuracy": step.accuracy,
            "lr": step.lr,
            "images_per_sec": step.images_per_sec,
            "data_wait_ms": step.data_wait.as_secs_f64() * 1e3,
        });
        if let Some(scale) = step.loss_scale {
            line["loss_scale"] = json!(scale);
        }
        self.write(line)
    }

    fn on_epoch(&mut self, epoch: &EpochSummary) -> Result<(), TrainError> {
        // Steps done when the epoch ended.
        let last_step = self.steps.last().map_or(0, |s| s.step as u64 + 1);
        self.write(json!({
            "epoch_end": last_step,
            "epoch": epoch.epoch,
            "train_loss": epoch.train_loss,
            "train_accuracy": epoch.train_accuracy,
            "valid_loss": epoch.valid_loss,
            "valid_accuracy": epoch.valid_accuracy,
            "images_per_sec": epoch.images_per_sec,
            "seconds": epoch.elapsed.as_secs_f64(),
            "data_wait_seconds": epoch.data_wait.as_secs_f64(),
        }))?;
        let path = self.dir.join(METRICS);
        self.out.flush().map_err(|err| failed(&path, err))?;
        self.draw()
    }
}

fn failed(path: &Path, err: std::io::Error) -> TrainError {
    TrainError::Log(format!("{}: {err}", path.display()))
}
