//! A pipeline report as the lines a run prints: each stage, the bubble against the
//! schedule's formula, the trained parameters' fingerprint.

use std::fmt::{self, Write};

use kiln_amp::Precision;

use crate::runtime::{PipelineConfig, PipelineReport, StageReport};
use crate::schedule::{ScheduleError, ScheduleKind, bubble_formula};

impl fmt::Display for StageReport {
    /// Its segments, parameter bytes, peak memory (where measured), peak micro-batch
    /// activations in flight and busy share of the step.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "segments {:?} | parameters {:.2} MB",
            self.segments,
            self.param_bytes as f64 / 1e6
        )?;
        if let Some(peak) = self.peak_bytes {
            write!(f, " | peak memory {:.1} MB", peak as f64 / 1e6)?;
        }
        write!(
            f,
            " | peak {} micro-batch activations | busy {:.0}%",
            self.peak_in_flight,
            100.0 * self.busy_fraction
        )
    }
}

impl PipelineReport {
    /// The measured bubble beside the textbook one of `kind` with `stages` stages and
    /// `micro_batches` (equal stages). (With stages in other processes this report holds
    /// this process's stages only, so the pipeline's depth is given.)
    ///
    /// # Errors
    /// When `kind` cannot run that shape (see [`bubble_formula`]).
    pub fn bubble_line(
        &self,
        kind: ScheduleKind,
        stages: usize,
        micro_batches: usize,
    ) -> Result<String, ScheduleError> {
        Ok(format!(
            "bubble: measured {:.1}% | formula {:.1}% (equal stages)",
            100.0 * self.bubble_fraction(),
            100.0 * bubble_formula(kind, stages, micro_batches)?
        ))
    }

    /// The run's summary, as it prints it: the first and last step's loss, the step time and
    /// rate (`samples_per_step` over all pipelines), each of this process's stages, the bubble
    /// (`stages`: the pipeline's depth), the trained parameters' fingerprint, mixed
    /// precision's scaler and where a stop request ended the run.
    ///
    /// # Errors
    /// When `config`'s schedule cannot run `stages` stages (see [`bubble_formula`]).
    pub fn summary(
        &self,
        config: &PipelineConfig,
        stages: usize,
        samples_per_step: usize,
    ) -> Result<String, ScheduleError> {
        let first = self.losses.first().copied().unwrap_or(f32::NAN);
        let last = self.losses.last().copied().unwrap_or(f32::NAN);
        let step = self.step_time.as_secs_f64();
        let mut out = format!(
            "loss {first:.4} -> {last:.4} | step {:.1} ms | {:.0} samples/s\n",
            step * 1e3,
            samples_per_step as f64 / step.max(1e-9)
        );
        for (index, stage) in self.stages.iter().enumerate() {
            let _ = writeln!(out, "stage {index}: {stage}");
        }
        let bubble = self.bubble_line(config.schedule, stages, config.micro_batches)?;
        let _ = writeln!(out, "{bubble}");
        let _ = writeln!(
            out,
            "trained parameters fingerprint: {:016x}",
            self.fingerprint()
        );
        let precision = config.precision.precision();
        if precision != Precision::F32 {
            let amp = &self.amp;
            let _ = writeln!(
                out,
                "AMP {precision}: loss scale {}, {} of {} steps skipped",
                amp.scale, amp.skipped, amp.steps
            );
        }
        if let Some(stopped) = self.stopped_at {
            let _ = writeln!(
                out,
                "stopped at step {} by SIGTERM; continue with --resume latest",
                stopped.step
            );
        }
        Ok(out)
    }

    /// A fingerprint of the trained parameters in path order: equal for every schedule
    /// and split (each adds the same micro-batch gradients in the same order).
    pub fn fingerprint(&self) -> u64 {
        let mut paths: Vec<&String> = self.params.keys().collect();
        paths.sort();
        let values: Vec<f32> = paths
            .into_iter()
            .flat_map(|path| self.params[path].iter().copied())
            .collect();
        kiln_core::fingerprint_values(&values)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use crate::runtime::{PipelineReport, StageReport};
    use crate::schedule::ScheduleKind;

    fn stage(busy_fraction: f64) -> StageReport {
        StageReport {
            segments: vec![0..2, 4..5],
            param_bytes: 2_500_000,
            peak_bytes: Some(12_340_000),
            peak_in_flight: 3,
            busy_fraction,
            forward_time: vec![Duration::from_millis(1)],
            backward_time: vec![Duration::from_millis(2)],
        }
    }

    #[test]
    fn the_lines_show_each_stage_the_bubble_and_an_order_free_fingerprint() {
        let params = |order: &[(&str, Vec<f32>)]| -> HashMap<String, Vec<f32>> {
            order
                .iter()
                .map(|(p, v)| (p.to_string(), v.clone()))
                .collect()
        };
        let report = PipelineReport {
            losses: vec![2.0, 1.5],
            stages: vec![stage(0.8), stage(0.6)],
            step_time: Duration::from_millis(10),
            predicted_step_time: Duration::ZERO,
            params: params(&[("a", vec![1.0, 2.0]), ("b", vec![3.0])]),
            stopped_at: None,
            epochs: Vec::new(),
            amp: Default::default(),
        };
        assert_eq!(
            report.stages[0].to_string(),
            "segments [0..2, 4..5] | parameters 2.50 MB | peak memory 12.3 MB | peak 3 micro-batch activations | busy 80%"
        );
        // GPipe, 2 stages, 2 micro-batches: (P-1)/(M+P-1) = 1/3 of the step.
        assert_eq!(
            report.bubble_line(ScheduleKind::GPipe, 2, 2).unwrap(),
            "bubble: measured 30.0% | formula 33.3% (equal stages)"
        );
        assert!(report.bubble_line(ScheduleKind::GPipe, 0, 2).is_err());
        let config = crate::PipelineConfig {
            schedule: ScheduleKind::GPipe,
            micro_batches: 2,
            ..crate::PipelineConfig::default()
        };
        let summary = report.summary(&config, 2, 50).unwrap();
        let lines: Vec<&str> = summary.lines().collect();
        assert_eq!(
            lines[0],
            "loss 2.0000 -> 1.5000 | step 10.0 ms | 5000 samples/s"
        );
        assert!(lines[1].starts_with("stage 0: segments"), "{}", lines[1]);
        assert_eq!(
            lines[3],
            "bubble: measured 30.0% | formula 33.3% (equal stages)"
        );
        assert!(lines[4].starts_with("trained parameters fingerprint: "));
        assert_eq!(lines.len(), 5, "f32, not stopped: {summary}");
        let same = PipelineReport {
            params: params(&[("b", vec![3.0]), ("a", vec![1.0, 2.0])]),
            ..report.clone()
        };
        assert_eq!(report.fingerprint(), same.fingerprint());
        assert_eq!(
            report.fingerprint(),
            kiln_core::fingerprint_values(&[1.0, 2.0, 3.0])
        );
    }
}
