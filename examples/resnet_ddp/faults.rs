//! `--inject-fault` and `--max-restarts`: a replica that fails mid-run, and a run that
//! restarts from its latest checkpoint (what the README's failure matrix tests).

use std::sync::atomic::{AtomicBool, Ordering};

use kiln::core::ImageClassifier;
use kiln::data::ImageBatch;
use kiln::train::{GradientStep, StepOutput, StepState, TrainError};

/// A fault to inject once per process: `panic-at-step:N` makes the last replica panic when
/// it reaches optimizer step N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub step: usize,
}

impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.strip_prefix("panic-at-step:")
            .and_then(|n| n.parse().ok())
            .map(|step| Fault { step })
            .ok_or_else(|| format!("`{text}`: expected panic-at-step:N"))
    }
}

/// Fired once: the restarted run does not fail again.
static FIRED: AtomicBool = AtomicBool::new(false);

/// Whether a fault may still be injected (true once per process: the pipeline's stages
/// inject it themselves, so the first attempt takes it).
pub fn arm() -> bool {
    !FIRED.swap(true, Ordering::SeqCst)
}

/// A gradient step that panics at the fault's step (once per process), else the inner
/// step's.
pub struct Faulty<S> {
    pub inner: S,
    pub fault: Option<Fault>,
}

impl<M: ImageClassifier, S: GradientStep<M>> GradientStep<M> for Faulty<S> {
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<ImageBatch>,
        step: usize,
    ) -> Result<StepOutput, TrainError> {
        if let Some(fault) = self.fault
            && step == fault.step
            && !FIRED.swap(true, Ordering::SeqCst)
        {
            panic!("injected fault at step {step} (--inject-fault)");
        }
        self.inner.gradients(model, batches, step)
    }

    fn after_update(&mut self, model: M, step: usize) -> Result<M, TrainError> {
        self.inner.after_update(model, step)
    }

    fn before_eval(&mut self, model: M) -> Result<M, TrainError> {
        self.inner.before_eval(model)
    }

    fn saved_state(&self) -> StepState {
        self.inner.saved_state()
    }

    fn loss_scale(&self) -> Option<f32> {
        self.inner.loss_scale()
    }

    fn restore_state(&mut self, state: &StepState) -> Result<(), TrainError> {
        self.inner.restore_state(state)
    }

    fn agree_to_stop(&mut self, asked: bool) -> Result<bool, TrainError> {
        self.inner.agree_to_stop(asked)
    }

    fn agree_on_start(&mut self, step: usize) -> Result<(), TrainError> {
        self.inner.agree_on_start(step)
    }
}
