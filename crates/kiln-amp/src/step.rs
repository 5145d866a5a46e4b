//! The mixed-precision gradient step.

use std::sync::{Arc, Mutex};

use burn::optim::GradientsParams;
use burn::tensor::FloatDType;
use kiln_comm::{CommWorker, ReduceBuffer, ReduceOp};
use kiln_core::{FlatLayout, GradWriter, ImageClassifier, grads_from_flat, param_infos};
use kiln_data::ImageBatch;
use kiln_train::{
    GradientStep, StepMetrics, StepOutput, TrainError, classification_loss, count_correct,
};

use crate::{AmpPolicy, GradScaler, Precision, cast_module};

/// What the AMP step has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AmpStats {
    /// Steps run.
    pub steps: usize,
    /// Steps skipped because a gradient was inf or NaN.
    pub skipped: usize,
    /// The loss scale now (1 without a scaler).
    pub scale: f32,
}

/// A gradient step that computes in f16 or bf16 and returns f32 gradients for the f32
/// master weights (see the crate docs).
///
/// With [`data_parallel`](Self::data_parallel) it also all-reduces the gradients with the
/// other replicas. Gradients are cast to f32 first and reduced in f32: half-precision
/// reduction would round every partial sum, and in-process the traffic saving is nil. An
/// inf/NaN on any replica makes the reduced sum non-finite on all of them, so every replica
/// skips the same steps and their scalers stay identical.
///
/// ```
/// use burn::optim::SgdConfig;
/// use burn::tensor::Device;
/// use kiln_amp::{AmpStep, Precision};
/// use kiln_data::{DataLoader, SyntheticImages};
/// use kiln_resnet::{ResNetConfig, StemKind};
/// use kiln_train::Trainer;
///
/// let device = Device::flex().autodiff();
/// let model = kiln_core::init_module(&device, 42, || {
///     ResNetConfig::resnet18(4).with_stem(StemKind::Cifar).with_base_width(2).init(&device)
/// });
/// let loader = DataLoader::builder(SyntheticImages::new(16, 4, 1, [3, 8, 8])).batch_size(8).device(device).build();
/// let (model, _) = Trainer::builder(model, SgdConfig::new().init())
///     .gradient_step(AmpStep::new(Precision::Bf16))
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
#[derive(Debug)]
pub struct AmpStep {
    precision: Precision,
    policy: AmpPolicy,
    scaler: Option<GradScaler>,
    comm: Option<Arc<CommWorker>>,
    layout: Option<FlatLayout>,
    stats: Arc<Mutex<AmpStats>>,
}

impl AmpStep {
    /// AMP at `precision`, with the default policy, and a [`GradScaler`] for f16 only.
    pub fn new(precision: Precision) -> Self {
        Self {
            precision,
            policy: AmpPolicy::default(),
            scaler: precision.needs_scaling().then(GradScaler::default),
            comm: None,
            layout: None,
            stats: Arc::new(Mutex::new(AmpStats {
                scale: 1.0,
                ..AmpStats::default()
            })),
        }
    }

    /// Uses `scaler` (e.g. restored from a checkpoint, or to scale bf16 too).
    pub fn with_scaler(mut self, scaler: GradScaler) -> Self {
        self.scaler = Some(scaler);
        self
    }

    /// Uses `policy` to decide which parameters stay f32.
    pub fn with_policy(mut self, policy: AmpPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// All-reduces gradients through `comm` (one replica of a data-parallel run; see
    /// [`Replica::comm`](kiln_ddp::Replica::comm)).
    pub fn data_parallel(mut self, comm: Arc<CommWorker>) -> Self {
        self.comm = Some(comm);
        self
    }

    /// The scaler, to save with a checkpoint.
    pub fn scaler(&self) -> Option<&GradScaler> {
        self.scaler.as_ref()
    }

    /// A handle on the statistics, readable after training.
    pub fn stats(&self) -> Arc<Mutex<AmpStats>> {
        Arc::clone(&self.stats)
    }
}

impl<M: ImageClassifier> GradientStep<M> for AmpStep {
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<ImageBatch>,
        _step: usize,
    ) -> Result<StepOutput, TrainError> {
        let layout = self.layout.take().unwrap_or_else(|| {
            FlatLayout::new(param_infos(model).into_iter().filter(|p| p.trainable))
        });
        let dtype = self.precision.dtype();
        let working = cast_module(model.clone(), dtype, &self.policy);
        let scale = self.scaler.as_ref().map_or(1.0, GradScaler::scale);
        // One extra element carries the sample count through the all-reduce.
        let mut flat = vec![0.0f32; layout.len() + 1];
        let mut metrics = StepMetrics::default();
        for batch in batches {
            let size = batch.indices.len();
            let images = if dtype == FloatDType::F32 {
                batch.images
            } else {
                batch.images.cast(dtype)
            };
            // Softmax, cross-entropy and the loss run in f32.
            let logits = working.forward_logits(images).cast(FloatDType::F32);
            let loss = classification_loss(logits.clone(), batch.labels.clone());
            let mut grads = loss.clone().mul_scalar(scale).backward();
            // Gradients arrive in the working precision; the writer widens them to f32 and
            // unscales (weighting by batch size for exact accumulation).
            working.visit(&mut GradWriter {
                grads: &mut grads,
                layout: &layout,
                flat: &mut flat[..layout.len()],
                scale: size as f32 / scale,
                accumulate: true,
            });
            let right = count_correct(logits.detach(), batch.labels);
            metrics.record(loss.into_scalar::<f32>(), right, size);
        }
        flat[layout.len()] = metrics.samples() as f32;
        if let Some(comm) = &self.comm {
            let mut buffer = ReduceBuffer::new(flat.len(), comm.world_size());
            buffer.copy_from(&flat);
            let buffer = comm.run(move |c| {
                c.all_reduce_buffer(&mut buffer, ReduceOp::Sum)
                    .map(|_| buffer)
            })?;
            buffer.copy_to(&mut flat);
        }
        let total = flat[layout.len()].max(1.0);
        let non_finite = flat.iter().any(|g| !g.is_finite());
        let apply = match &mut self.scaler {
            Some(scaler) => scaler.update(non_finite),
            None => !non_finite,
        };
        let grads = if apply {
            flat.iter_mut().for_each(|g| *g /= total);
            grads_from_flat(model, &layout, &flat[..layout.len()])
        } else {
            // No gradients: the optimizer leaves parameters and its state untouched.
            GradientsParams::new()
        };
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.steps += 1;
            stats.skipped += usize::from(!apply);
            stats.scale = self.scaler.as_ref().map_or(1.0, GradScaler::scale);
        }
        self.layout = Some(layout);
        Ok(metrics.output(grads))
    }

    fn before_eval(&mut self, model: M) -> Result<M, TrainError> {
        // Data parallel: batch-norm running statistics differ per replica (each saw its own
        // shard); average them so every replica evaluates and checkpoints the same model.
        match &self.comm {
            Some(comm) => Ok(kiln_ddp::average_buffers(comm, model)?),
            None => Ok(model),
        }
    }
}
