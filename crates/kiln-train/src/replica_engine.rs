//! The step engine of one model replica: its gradient step (one device, or data parallel
//! through the step's collectives), the optimizer update, checkpoints through a hook and
//! validation on the replica's inference device. [`Trainer::fit`](crate::Trainer::fit) runs
//! it under the training loop.

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use kiln_core::Forward;
use kiln_data::BatchSource;

use crate::{
    CheckpointHook, EngineStep, Evaluation, GradientStep, Objective, StepEngine, TrainError,
    TrainPosition, evaluate_with,
};

/// One replica: the model, its optimizer and gradient step, the objective validation
/// scores, and the checkpoint hook.
pub(crate) struct ReplicaEngine<M, S, O> {
    /// `None` only while the optimizer holds it (a step consumes and returns the model).
    model: Option<M>,
    optimizer: ModuleOptimizer,
    step: S,
    objective: O,
    accumulation: usize,
    checkpoint: Option<Box<dyn CheckpointHook<M>>>,
}

impl<M, S, O> ReplicaEngine<M, S, O> {
    pub(crate) fn new(
        (model, optimizer, step): (M, ModuleOptimizer, S),
        objective: O,
        accumulation: usize,
        checkpoint: Option<Box<dyn CheckpointHook<M>>>,
    ) -> Self {
        Self {
            model: Some(model),
            optimizer,
            step,
            objective,
            accumulation,
            checkpoint,
        }
    }

    /// The trained model.
    pub(crate) fn into_model(self) -> M {
        self.model.expect("the model is back after every step")
    }

    fn model(&self) -> &M {
        self.model
            .as_ref()
            .expect("the model is back after every step")
    }

    /// Runs `f` on the model it takes and puts back the model `f` returns.
    fn update(
        &mut self,
        f: impl FnOnce(&mut Self, M) -> Result<M, TrainError>,
    ) -> Result<(), TrainError> {
        let model = self
            .model
            .take()
            .expect("the model is back after every step");
        let model = f(self, model)?;
        self.model = Some(model);
        Ok(())
    }
}

impl<M, S, O> StepEngine<O::Batch> for ReplicaEngine<M, S, O>
where
    O: Objective,
    M: Module + Forward<Input = O::Input, Output = O::Output>,
    S: GradientStep<M, O::Batch>,
{
    type Error = TrainError;

    fn batches_per_step(&self) -> usize {
        self.accumulation
    }

    fn step(
        &mut self,
        batches: Vec<O::Batch>,
        step: usize,
        lr: f64,
    ) -> Result<EngineStep, TrainError> {
        let model = self
            .model
            .as_ref()
            .expect("the model is back after every step");
        let out = self.step.gradients(model, batches, step)?;
        let (loss, correct, samples) = (out.loss, out.correct, out.samples);
        let grads = out.grads;
        self.update(|engine, model| {
            let model = engine.optimizer.step(lr, model, grads);
            engine.step.after_update(model, step)
        })?;
        Ok(EngineStep {
            loss,
            correct,
            samples,
            loss_scale: self.step.loss_scale(),
        })
    }

    fn agree_to_stop(&mut self, asked: bool) -> Result<bool, TrainError> {
        self.step.agree_to_stop(asked)
    }

    fn checkpoint_due(&self, position: &TrainPosition, last: bool) -> bool {
        self.checkpoint
            .as_ref()
            .is_some_and(|hook| hook.should_save(position, last))
    }

    fn checkpoint(&mut self, position: &TrainPosition) -> Result<(), TrainError> {
        // Every replica takes part: what they hold apart (batch-norm statistics) is made
        // one, as before an evaluation.
        self.update(|engine, model| engine.step.before_eval(model))?;
        if let Some(hook) = &mut self.checkpoint {
            let model = self
                .model
                .as_ref()
                .expect("the model is back after every step");
            hook.save(position, model, &self.optimizer, &self.step.saved_state())?;
        }
        Ok(())
    }

    fn end_epoch(
        &mut self,
        _epoch: usize,
        valid: Option<&mut dyn BatchSource<Batch = O::Batch>>,
    ) -> Result<Option<Evaluation>, TrainError> {
        self.update(|engine, model| engine.step.before_eval(model))?;
        let Some(valid) = valid else {
            return Ok(None);
        };
        evaluate_with(&self.model().valid(), &self.objective, valid).map(Some)
    }

    fn finish(&mut self) -> Result<(), TrainError> {
        match &mut self.checkpoint {
            Some(hook) => hook.finish(),
            None => Ok(()),
        }
    }
}
