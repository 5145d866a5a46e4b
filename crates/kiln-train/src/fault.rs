//! Failures injected on purpose, to test what must survive one: restarts from the latest
//! checkpoint, and a lost replica reported as an error on every other.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::module::Module;
use kiln_data::Batch;

use crate::{GradientStep, StepOutput, StepState, TrainError};

/// A panic at one optimizer step, taken once: clones share whether it has fired, so the
/// run restarted after it does not fail again. Parsed from `panic-at-step:N`.
#[derive(Debug, Clone)]
pub struct InjectedFault {
    step: usize,
    fired: Arc<AtomicBool>,
}

impl InjectedFault {
    /// A panic when training reaches optimizer step `step` (counted from the run's start,
    /// as checkpoints count).
    pub fn panic_at_step(step: usize) -> Self {
        Self {
            step,
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The step it fires at.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Takes the fault: `true` the first time only, for a runtime that injects it itself
    /// (a pipeline's stage).
    pub fn take(&self) -> bool {
        !self.fired.swap(true, Ordering::SeqCst)
    }
}

impl PartialEq for InjectedFault {
    fn eq(&self, other: &Self) -> bool {
        self.step == other.step
    }
}

impl FromStr for InjectedFault {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.strip_prefix("panic-at-step:")
            .and_then(|n| n.parse().ok())
            .map(Self::panic_at_step)
            .ok_or_else(|| format!("`{text}`: expected panic-at-step:N"))
    }
}

/// A gradient step that panics at its fault's step (once, see [`InjectedFault`]), else is
/// `inner`.
pub struct FaultyStep<S> {
    inner: S,
    fault: Option<InjectedFault>,
}

impl<S> FaultyStep<S> {
    /// `inner`, failing as `fault` says (`None`: never).
    pub fn new(inner: S, fault: Option<InjectedFault>) -> Self {
        Self { inner, fault }
    }
}

impl<M: Module, B: Batch, S: GradientStep<M, B>> GradientStep<M, B> for FaultyStep<S> {
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<B>,
        step: usize,
    ) -> Result<StepOutput, TrainError> {
        if let Some(fault) = &self.fault
            && step == fault.step
            && fault.take()
        {
            panic!("injected fault at step {step}");
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

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use burn::tensor::Device;

    use super::{FaultyStep, InjectedFault};
    use crate::testing::{Mse, RegressionNet, regression_batches};
    use crate::{GradientStep, LocalStep};

    #[test]
    fn the_fault_fires_at_its_step_once_across_clones() {
        let device = Device::flex().autodiff();
        let model = RegressionNet::new(&device, 1);
        let batches = regression_batches(1, 4, &device);
        let fault: InjectedFault = "panic-at-step:2".parse().unwrap();
        let mut step = FaultyStep::new(
            LocalStep::with_objective(Mse::default()),
            Some(fault.clone()),
        );
        for at in 0..2 {
            step.gradients(&model, batches.clone(), at)
                .expect("before the fault");
        }
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            let _ = step.gradients(&model, batches.clone(), 2);
        }));
        assert!(panicked.is_err(), "step 2 must panic");
        // A restart (a new step sharing the fault) passes step 2.
        let mut restarted = FaultyStep::new(
            LocalStep::with_objective(Mse::default()),
            Some(fault.clone()),
        );
        restarted
            .gradients(&model, batches, 2)
            .expect("fired already");
        assert!(!fault.take());
        assert!("panic-at-step:x".parse::<InjectedFault>().is_err());
        assert!(InjectedFault::panic_at_step(3).take());
    }
}
