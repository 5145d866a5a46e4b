//! A mark in a kernel profile between the warm-up and the steady state.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use burn::tensor::Device;

use crate::{EpochSummary, StepRecord, TrainError, TrainObserver};

/// After its `after_steps`-th step, waits for the device to finish and for cubecl's
/// profiling logger to write what it measured, then appends `kiln: steady state after N
/// steps` to the profile, so that its reader can leave the warm-up (compilation, tuning)
/// out.
pub struct SteadyStateMark {
    file: PathBuf,
    after_steps: usize,
    device: Device,
    seen: usize,
}

impl SteadyStateMark {
    /// Marks `file` once `after_steps` steps on `device` are done.
    pub fn new(file: impl Into<PathBuf>, after_steps: usize, device: Device) -> Self {
        Self {
            file: file.into(),
            after_steps,
            device,
            seen: 0,
        }
    }
}

impl TrainObserver for SteadyStateMark {
    fn on_step(&mut self, _: &StepRecord) -> Result<(), TrainError> {
        self.seen += 1;
        if self.seen != self.after_steps {
            return Ok(());
        }
        let failed =
            |why: String| TrainError::Log(format!("kernel profile {}: {why}", self.file.display()));
        self.device.sync().map_err(|err| failed(err.to_string()))?;
        // cubecl's logger resolves and writes each kernel's time on its own thread.
        std::thread::sleep(Duration::from_millis(500));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .map_err(|err| failed(err.to_string()))?;
        writeln!(file, "kiln: steady state after {} steps", self.seen)
            .map_err(|err| failed(err.to_string()))
    }

    fn on_epoch(&mut self, _: &EpochSummary) -> Result<(), TrainError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use burn::tensor::Device;

    use super::SteadyStateMark;
    use crate::{StepRecord, TrainObserver};

    #[test]
    fn the_mark_is_written_once_after_the_warm_up() {
        let dir = std::env::temp_dir().join(format!("kiln-steady-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("profile.txt");
        std::fs::write(&file, "kernel a 1 us\n").unwrap();
        let mut mark = SteadyStateMark::new(&file, 2, Device::flex());
        let record = StepRecord {
            epoch: 0,
            step: 0,
            loss: 1.0,
            accuracy: 0.0,
            lr: 0.1,
            images_per_sec: 1.0,
            data_wait: Duration::ZERO,
            loss_scale: None,
        };
        for _ in 0..4 {
            mark.on_step(&record).unwrap();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text, "kernel a 1 us\nkiln: steady state after 2 steps\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
