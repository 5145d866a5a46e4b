//! What the trainer records.

use std::time::Duration;

use crate::Reporting;

/// One training step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// 0-based epoch.
    pub epoch: usize,
    /// 0-based global step.
    pub step: usize,
    /// Mean training loss of the batch.
    pub loss: f32,
    /// Fraction of the batch classified correctly.
    pub accuracy: f32,
    /// Learning rate used.
    pub lr: f64,
    /// Images processed per second in this step (this replica).
    pub images_per_sec: f64,
    /// Time this step waited for its batches.
    pub data_wait: Duration,
    /// The loss scale after this step (mixed precision with a scaler), `None` without one.
    pub loss_scale: Option<f32>,
}

/// One epoch's summary.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochSummary {
    /// 0-based epoch.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f32,
    /// Training accuracy over the epoch.
    pub train_accuracy: f32,
    /// Validation loss, when a validation loader is set.
    pub valid_loss: Option<f32>,
    /// Validation accuracy, when a validation loader is set.
    pub valid_accuracy: Option<f32>,
    /// Training images per second over the epoch.
    pub images_per_sec: f64,
    /// Wall time of the epoch's training steps.
    pub elapsed: Duration,
    /// Time the loop waited for training batches.
    pub data_wait: Duration,
}

impl EpochSummary {
    /// The epoch's printed line, naming samples and showing accuracy as `reporting` says.
    pub fn line(&self, reporting: Reporting) -> String {
        let mut line = format!("epoch {:>3}: loss {:.4}", self.epoch + 1, self.train_loss);
        if reporting.accuracy {
            line += &format!("  acc {:>5.1}%", 100.0 * self.train_accuracy);
        }
        if let Some(loss) = self.valid_loss {
            line += &format!("  | val loss {loss:.4}");
        }
        if let (Some(acc), true) = (self.valid_accuracy, reporting.accuracy) {
            line += &format!("  val acc {:>5.1}%", 100.0 * acc);
        }
        line + &format!(
            "  | {:.0} {}/s  {:.1}s  data wait {:.1}%",
            self.images_per_sec,
            reporting.sample,
            self.elapsed.as_secs_f64(),
            100.0 * self.data_wait.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
        )
    }
}

/// The line of an image classifier's epoch ([`EpochSummary::line`] with
/// [`Reporting::IMAGES`]).
impl std::fmt::Display for EpochSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line(Reporting::IMAGES))
    }
}

/// Everything a run recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainReport {
    /// Every step, in order.
    pub steps: Vec<StepRecord>,
    /// Every epoch, in order.
    pub epochs: Vec<EpochSummary>,
    /// Where training stopped when a [`StopFlag`](crate::StopFlag) ended it early.
    pub stopped_at: Option<crate::TrainPosition>,
    /// This run's first step, for start-up accounting (on a GPU the first step also
    /// compiles and tunes kernels); `None` when no step ran.
    pub first_step: Option<FirstStep>,
}

/// When a run's first step ended and how long it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirstStep {
    /// When it ended (its loss read, its update enqueued).
    pub finished: std::time::Instant,
    /// From fetching its batches to its end.
    pub took: Duration,
}

impl TrainReport {
    /// The loss of every step, in order.
    pub fn losses(&self) -> Vec<f32> {
        self.steps.iter().map(|s| s.loss).collect()
    }

    /// The last epoch's validation accuracy, if measured.
    pub fn final_valid_accuracy(&self) -> Option<f32> {
        self.epochs.last().and_then(|e| e.valid_accuracy)
    }

    /// Seconds spent in the epochs' training (validation not counted).
    pub fn training_seconds(&self) -> f64 {
        self.epochs.iter().map(|e| e.elapsed.as_secs_f64()).sum()
    }

    /// Samples trained over [`training_seconds`](Self::training_seconds), from the epochs'
    /// own rates (so a resumed run counts only what this run trained).
    pub fn samples_trained(&self) -> f64 {
        self.epochs
            .iter()
            .map(|e| e.images_per_sec * e.elapsed.as_secs_f64())
            .sum()
    }

    /// The median step's seconds after the first (which warms up: on a GPU it compiles and
    /// tunes kernels), for steps of `samples_per_step` samples; `None` with fewer than two
    /// steps.
    pub fn median_step_seconds(&self, samples_per_step: usize) -> Option<f64> {
        let mut seconds: Vec<f64> = self
            .steps
            .iter()
            .skip(1)
            .map(|step| samples_per_step as f64 / step.images_per_sec.max(1e-9))
            .collect();
        seconds.sort_by(f64::total_cmp);
        seconds.get(seconds.len() / 2).copied()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::EpochSummary;
    use crate::{Classification, LanguageModeling, Objective};

    #[test]
    fn an_epoch_line_names_samples_and_shows_accuracy_as_its_objective_says() {
        let summary = EpochSummary {
            epoch: 0,
            train_loss: 2.5,
            train_accuracy: 0.5,
            valid_loss: Some(2.0),
            valid_accuracy: Some(0.25),
            images_per_sec: 100.0,
            elapsed: Duration::from_secs(2),
            data_wait: Duration::ZERO,
        };
        let images = summary.line(Classification.reporting());
        assert!(images.contains("acc  50.0%") && images.contains("val acc  25.0%"));
        assert!(images.contains("100 img/s"), "{images}");
        assert_eq!(images, summary.to_string());
        let text = summary.line(LanguageModeling.reporting());
        assert!(!text.contains("acc"), "{text}");
        assert!(
            text.contains("val loss 2.0000") && text.contains("100 windows/s"),
            "{text}"
        );
    }

    #[test]
    fn the_median_step_leaves_the_first_out_and_needs_two_steps() {
        let step = crate::testing::step_at;
        let mut report = super::TrainReport {
            steps: vec![step(1.0)],
            ..Default::default()
        };
        assert_eq!(report.median_step_seconds(10), None);
        // 10 samples a step: the warm-up's 10 s is left out, then 0.1 s, 0.5 s, 0.2 s.
        report.steps.extend([step(100.0), step(20.0), step(50.0)]);
        assert_eq!(report.median_step_seconds(10), Some(0.2));
    }
}
