//! Producing the gradients of one training step.

use std::sync::{Arc, Mutex};

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::Gradients;
use kiln_amp::{AmpStats, MixedPrecision};
use kiln_core::{Forward, ImageClassifier};
use kiln_data::{Batch, ImageBatch};

use crate::accumulate::Accumulator;
use crate::{Classification, MeanGradient, Objective, TrainError, objective_loss};

/// What one gradient step produced.
#[derive(Debug)]
pub struct StepOutput {
    /// The gradients to apply (already synchronised, for a distributed step).
    pub grads: GradientsParams,
    /// Mean loss over this replica's batch.
    pub loss: f32,
    /// Samples the objective counted as right in this replica's batch (correctly
    /// classified, for [`Classification`]).
    pub correct: usize,
    /// Samples in this replica's batch.
    pub samples: usize,
}

/// Loss and accuracy of a step's micro-batches, summed per sample so that their mean is the
/// mean over all samples whatever the micro-batch sizes.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepMetrics {
    loss_sum: f64,
    correct: usize,
    samples: usize,
}

impl StepMetrics {
    /// Records a micro-batch of `samples` samples with mean loss `loss`.
    pub fn record(&mut self, loss: f32, correct: usize, samples: usize) {
        self.loss_sum += f64::from(loss) * samples as f64;
        self.correct += correct;
        self.samples += samples;
    }

    /// Samples recorded so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The step's output with `grads`.
    pub fn output(self, grads: GradientsParams) -> StepOutput {
        StepOutput {
            grads,
            loss: (self.loss_sum / self.samples.max(1) as f64) as f32,
            correct: self.correct,
            samples: self.samples,
        }
    }
}

/// A gradient step's state for checkpoints (JSON: the loss scaler's, for instance).
pub type StepState = serde_json::Value;

/// How a training step turns batches of type `B` into gradients of `M`, plus hooks around
/// the update.
///
/// [`LocalStep`] is plain forward and backward on one device. The data-parallel runtime
/// provides a step that also synchronises gradients (or parameters) with the other replicas;
/// the trainer's loop is the same for both. `B` is the batch type of the step's
/// [`Objective`] ([`ImageBatch`] by default, for [`Classification`]).
pub trait GradientStep<M: Module, B: Batch = ImageBatch> {
    /// Computes the gradients of `model` over the micro-batches `batches` (one or more, for
    /// gradient accumulation) at global step `step`: the mean over all their samples.
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<B>,
        step: usize,
    ) -> Result<StepOutput, TrainError>;

    /// Runs after the optimizer has updated `model` at `step` (e.g. parameter averaging).
    fn after_update(&mut self, model: M, _step: usize) -> Result<M, TrainError> {
        Ok(model)
    }

    /// Runs before validation and at the end of every epoch (e.g. batch-norm statistics sync).
    fn before_eval(&mut self, model: M) -> Result<M, TrainError> {
        Ok(model)
    }

    /// What a checkpoint must keep of the step besides the model and the optimizer (the
    /// loss scaler), as JSON; `null` when nothing.
    fn saved_state(&self) -> StepState {
        StepState::Null
    }

    /// The loss scale the next step uses (mixed precision with a scaler), for the run's
    /// log; `None` without one.
    fn loss_scale(&self) -> Option<f32> {
        None
    }

    /// Continues with state [`saved_state`](Self::saved_state) gave.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] when the state does not fit this step.
    fn restore_state(&mut self, state: &StepState) -> Result<(), TrainError> {
        if state.is_null() {
            Ok(())
        } else {
            Err(TrainError::checkpoint(
                "the checkpoint holds gradient-step state this step does not keep",
            ))
        }
    }

    /// Whether training stops after this step, given whether this replica was asked to
    /// (a [`StopFlag`](crate::StopFlag)): replicas that must stay in step agree here (any
    /// one asked stops all), so they stop at the same step.
    fn agree_to_stop(&mut self, asked: bool) -> Result<bool, TrainError> {
        Ok(asked)
    }

    /// Checked once before the first step, with the step the run starts (or resumes) at:
    /// replicas that must stay in step refuse to start at different steps (each read its
    /// own checkpoint, say from a run directory that is not shared).
    fn agree_on_start(&mut self, step: usize) -> Result<(), TrainError> {
        let _ = step;
        Ok(())
    }
}

/// Forward and backward on one device, in f32 or mixed precision, optionally clipping the
/// gradient's norm.
///
/// ```
/// use burn::optim::SgdConfig;
/// use burn::tensor::Device;
/// use kiln_amp::{MixedPrecision, Precision};
/// use kiln_data::{DataLoader, SyntheticImages};
/// use kiln_resnet::{ResNetConfig, StemKind};
/// use kiln_train::{LocalStep, Trainer};
///
/// let device = Device::flex().autodiff();
/// let model = kiln_core::init_module(&device, 42, || {
///     ResNetConfig::resnet18(4).with_stem(StemKind::Cifar).with_base_width(2).init(&device)
/// });
/// let loader = DataLoader::builder(SyntheticImages::new(16, 4, 1, [3, 8, 8])).batch_size(8).device(device).build();
/// let step = LocalStep::new()
///     .with_precision(MixedPrecision::new(Precision::Bf16))
///     .with_max_grad_norm(1.0)
///     .unwrap();
/// let (model, _) = Trainer::builder(model, SgdConfig::new().init())
///     .gradient_step(step)
///     .train_loader(loader)
///     .max_steps(2)
///     .progress(false)
///     .log_epochs(false)
///     .build()
///     .unwrap()
///     .fit()
///     .unwrap();
/// // Master weights stay f32.
/// assert!(kiln_amp::module_dtypes(&model).iter().all(|d| *d == burn::tensor::DType::F32));
/// ```
///
/// It trains for [`Classification`] unless given another [`Objective`]
/// ([`with_objective`](Self::with_objective)).
#[derive(Debug, Default)]
pub struct LocalStep<O = Classification> {
    rule: MeanGradient,
    objective: O,
}

impl LocalStep<Classification> {
    /// Plain f32 forward and backward of the classification objective.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<O: Objective> LocalStep<O> {
    /// Plain f32 forward and backward of `objective`.
    pub fn with_objective(objective: O) -> Self {
        Self {
            rule: MeanGradient::default(),
            objective,
        }
    }

    /// Computes in `precision` (f32 master weights, see [`MixedPrecision`]).
    pub fn with_precision(self, precision: MixedPrecision) -> Self {
        Self {
            rule: self.rule.with_precision(precision),
            objective: self.objective,
        }
    }

    /// Clips the gradient to a global norm of at most `max_norm`.
    ///
    /// # Errors
    /// [`TrainError::Config`] unless `max_norm` is positive and finite.
    pub fn with_max_grad_norm(self, max_norm: f32) -> Result<Self, TrainError> {
        Ok(Self {
            rule: self.rule.with_max_norm(max_norm)?,
            objective: self.objective,
        })
    }

    /// The same settings (precision, clipping) with `objective` instead.
    pub fn objective<P: Objective>(self, objective: P) -> LocalStep<P> {
        LocalStep {
            rule: self.rule,
            objective,
        }
    }

    /// Skipped steps and the loss scale, readable after training.
    pub fn stats(&self) -> Arc<Mutex<AmpStats>> {
        self.rule.stats()
    }
}

/// Forward and backward of one image batch in `precision` (`model` is the working copy,
/// see [`MixedPrecision::working_copy`]): the raw autodiff gradients (of the scaled loss),
/// the loss and the number of correct predictions ([`forward_backward_with`] for
/// [`Classification`]).
pub fn forward_backward<M: ImageClassifier>(
    model: &M,
    batch: ImageBatch,
    precision: &MixedPrecision,
) -> (Gradients, f32, usize) {
    forward_backward_with(model, &Classification, batch, precision)
}

/// Forward and backward of one batch of `objective` in `precision` (`model` is the working
/// copy): the input cast to the working precision, the output widened to f32, the loss
/// scaled for backward. Returns the raw autodiff gradients (of the scaled loss), the loss
/// and the objective's [`correct`](Objective::correct) count.
pub fn forward_backward_with<M, O>(
    model: &M,
    objective: &O,
    batch: O::Batch,
    precision: &MixedPrecision,
) -> (Gradients, f32, usize)
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
{
    let output = precision.logits(model.forward(precision.input(objective.input(&batch))));
    let loss = objective_loss(objective, &output, &batch);
    let grads = precision.scaled_loss(loss.clone()).backward();
    (
        grads,
        loss.into_scalar::<f32>(),
        objective.correct(&output, &batch),
    )
}

impl<M, O> GradientStep<M, O::Batch> for LocalStep<O>
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
{
    fn saved_state(&self) -> StepState {
        self.rule.saved_state()
    }

    fn loss_scale(&self) -> Option<f32> {
        self.rule.loss_scale()
    }

    fn restore_state(&mut self, state: &StepState) -> Result<(), TrainError> {
        self.rule.restore_state(state)
    }

    fn gradients(
        &mut self,
        model: &M,
        mut batches: Vec<O::Batch>,
        _step: usize,
    ) -> Result<StepOutput, TrainError> {
        if batches.len() == 1 && !self.rule.checks() {
            // Plain f32, one batch: the loss is already the batch mean.
            let batch = batches.pop().expect("one batch");
            let samples = batch.samples();
            let (grads, loss, correct) =
                forward_backward_with(model, &self.objective, batch, self.rule.precision());
            let grads = GradientsParams::from_grads(grads, model);
            return Ok(StepOutput {
                grads,
                loss,
                correct,
                samples,
            });
        }
        let working = self.rule.precision().working_copy(model);
        let working = working.as_ref().unwrap_or(model);
        let mut accumulator = Accumulator::new(model);
        for batch in batches {
            accumulator.add(working, &self.objective, batch, self.rule.precision());
        }
        accumulator.finish(model, &mut self.rule)
    }
}

/// A boxed step is a step, so a program can choose one at run time
/// (`Box<dyn GradientStep<M>>`).
impl<M: Module, B: Batch, S: GradientStep<M, B> + ?Sized> GradientStep<M, B> for Box<S> {
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<B>,
        step: usize,
    ) -> Result<StepOutput, TrainError> {
        (**self).gradients(model, batches, step)
    }

    fn after_update(&mut self, model: M, step: usize) -> Result<M, TrainError> {
        (**self).after_update(model, step)
    }

    fn before_eval(&mut self, model: M) -> Result<M, TrainError> {
        (**self).before_eval(model)
    }

    fn saved_state(&self) -> StepState {
        (**self).saved_state()
    }

    fn loss_scale(&self) -> Option<f32> {
        (**self).loss_scale()
    }

    fn restore_state(&mut self, state: &StepState) -> Result<(), TrainError> {
        (**self).restore_state(state)
    }

    fn agree_to_stop(&mut self, asked: bool) -> Result<bool, TrainError> {
        (**self).agree_to_stop(asked)
    }

    fn agree_on_start(&mut self, step: usize) -> Result<(), TrainError> {
        (**self).agree_on_start(step)
    }
}
