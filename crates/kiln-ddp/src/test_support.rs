//! What the equivalence tests share: a small user model (with optional batch norm), the
//! single-device reference and N-replica runs.
//!
//! The comparison and its tolerances are in `compare.rs` (re-exported here).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::activation::relu;
use burn::tensor::{DType, Device, FloatDType, Tensor};
use kiln_amp::{MixedPrecision, Precision};
use kiln_core::{
    FlatLayout, ImageClassifier, SegmentId, Segmented, fingerprint_values, init_module,
    param_infos, read_params,
};
use kiln_data::{DataError, DataLoader, ImageItem, ImageSource, SyntheticImages};
use kiln_train::{LocalStep, Trainer};

use crate::{DataParallel, DdpConfig};

pub(crate) use crate::compare::*;

/// A user's own small model. Without batch norm (the default) per-replica batches are
/// exact; with it, only synchronised batch norm makes replicas match one device.
#[derive(Module, Debug)]
pub(crate) struct TinyNet {
    pub stem: Conv2d,
    pub body: Vec<Conv2d>,
    pub head: Linear,
    /// Batch norm after the stem and after each body convolution.
    norms: Option<Vec<BatchNorm>>,
}

impl TinyNet {
    pub(crate) fn new(device: &Device) -> Self {
        Self::build(device, false)
    }

    pub(crate) fn build(device: &Device, batch_norm: bool) -> Self {
        Self::seeded(device, batch_norm, 11)
    }

    /// [`build`](Self::build) with the initialisation seed `seed` (11 for `build`).
    pub(crate) fn seeded(device: &Device, batch_norm: bool, seed: u64) -> Self {
        // Convolutions ahead of batch norm have no bias, as in ResNet: its exact gradient is
        // zero, so it would only move by rounding noise (large in bf16).
        let conv = |i, o| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .with_bias(!batch_norm)
                .init(device)
        };
        init_module(device, seed, || Self {
            stem: conv(3, 6),
            body: vec![conv(6, 6), conv(6, 6)],
            head: LinearConfig::new(6, 4).init(device),
            norms: batch_norm.then(|| {
                (0..3)
                    .map(|_| BatchNormConfig::new(6).init(device))
                    .collect()
            }),
        })
    }

    /// Batch norm `index` (synchronised in a synchronised pass), if the model has them. Under
    /// mixed precision the layer stays f32 (kiln-amp's default policy), so a half input is
    /// normalised in f32 and cast back.
    fn norm(&self, index: usize, x: Tensor<4>) -> Tensor<4> {
        let Some(norms) = &self.norms else {
            return x;
        };
        let dtype = x.dtype();
        if dtype == DType::F32 {
            return kiln_core::sync_batch_norm(&norms[index], x);
        }
        kiln_core::sync_batch_norm(&norms[index], x.cast(FloatDType::F32))
            .cast(FloatDType::from(dtype))
    }

    fn visit_norm<V: burn::module::ModuleVisitor>(&self, index: usize, visitor: &mut V) {
        if let Some(norms) = &self.norms {
            norms[index].visit(visitor);
        }
    }
}

impl ImageClassifier for TinyNet {
    fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
        kiln_core::forward_segments(self, images)
    }
}

impl Segmented for TinyNet {
    type Input = Tensor<4>;
    type Hidden = Tensor<4>;
    type Output = Tensor<2>;

    fn num_middle_segments(&self) -> usize {
        self.body.len()
    }
    fn forward_input(&self, input: Tensor<4>) -> Tensor<4> {
        relu(self.norm(0, self.stem.forward(input)))
    }
    fn forward_middle(&self, index: usize, hidden: Tensor<4>) -> Tensor<4> {
        relu(self.norm(index + 1, self.body[index].forward(hidden.clone()))) + hidden
    }
    fn forward_output(&self, hidden: Tensor<4>) -> Tensor<2> {
        let [batch, channels, _, _] = hidden.dims();
        self.head.forward(
            hidden
                .flatten::<3>(2, 3)
                .mean_dim(2)
                .reshape([batch, channels]),
        )
    }
    fn visit_segment<V: burn::module::ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V) {
        match segment {
            SegmentId::Input => {
                self.stem.visit(visitor);
                self.visit_norm(0, visitor);
            }
            SegmentId::Middle(i) => {
                self.body[i].visit(visitor);
                self.visit_norm(i + 1, visitor);
            }
            SegmentId::Output => self.head.visit(visitor),
        }
    }
}

pub(crate) const STEPS: usize = 5;

pub(crate) fn data() -> SyntheticImages {
    SyntheticImages::new(240, 4, 3, [3, 6, 6])
}

pub(crate) fn optimizer() -> burn::optim::ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}

pub(crate) fn params<M: Module>(model: &M) -> Vec<Vec<f32>> {
    let layout = FlatLayout::new(param_infos(model));
    let flat = read_params(model, &layout);
    layout
        .entries()
        .iter()
        .map(|e| flat[e.offset..e.offset + e.info.numel()].to_vec())
        .collect()
}

/// Trains on the CPU with `batch` samples per step (`micro` micro-batches of it).
pub(crate) fn single(
    source: impl ImageSource,
    batch: usize,
    micro: usize,
    shuffle: bool,
) -> Vec<Vec<f32>> {
    single_on(Device::flex(), source, batch, micro, shuffle)
}

/// Trains on `device` with `batch` samples per step (`micro` micro-batches of it).
pub(crate) fn single_on(
    device: Device,
    source: impl ImageSource,
    batch: usize,
    micro: usize,
    shuffle: bool,
) -> Vec<Vec<f32>> {
    single_model(device, source, batch, micro, shuffle, false)
}

/// [`single_on`] with or without batch norm in the model.
pub(crate) fn single_model(
    device: Device,
    source: impl ImageSource,
    batch: usize,
    micro: usize,
    shuffle: bool,
    batch_norm: bool,
) -> Vec<Vec<f32>> {
    let build = |device: &Device| TinyNet::build(device, batch_norm);
    single_with(
        device,
        source,
        batch,
        micro,
        shuffle,
        &Schedule::default(),
        build,
    )
}

/// How long, how fast and in what precision the equivalence runs train (the replicated runs
/// take their precision and clipping from here too, so both sides always agree).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub steps: usize,
    pub lr: f64,
    pub precision: Precision,
    pub max_grad_norm: Option<f32>,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            steps: STEPS,
            lr: 0.2,
            precision: Precision::F32,
            max_grad_norm: None,
        }
    }
}

impl Schedule {
    /// The single-device step of this schedule.
    fn local_step(&self) -> LocalStep {
        let step = LocalStep::new().with_precision(MixedPrecision::new(self.precision));
        match self.max_grad_norm {
            Some(max_norm) => step.with_max_grad_norm(max_norm).unwrap(),
            None => step,
        }
    }
}

/// [`single_on`] for any model `build` makes, on `schedule`.
pub(crate) fn single_with<M: ImageClassifier>(
    device: Device,
    source: impl ImageSource,
    batch: usize,
    micro: usize,
    shuffle: bool,
    schedule: &Schedule,
    build: impl Fn(&Device) -> M,
) -> Vec<Vec<f32>> {
    let device = device.autodiff();
    let mut loader = DataLoader::builder(source)
        .batch_size(batch / micro)
        .device(device.clone());
    if shuffle {
        loader = loader.shuffle(4);
    }
    let model = build(&device);
    let start = params(&model);
    let (model, _) = Trainer::builder(model, optimizer())
        .gradient_step(schedule.local_step())
        .schedule(kiln_train::LrSchedule::constant(schedule.lr))
        .train_loader(loader.build())
        .accumulation_steps(micro)
        .max_steps(schedule.steps)
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap()
        .fit()
        .unwrap();
    let trained = params(&model);
    remember_start(&trained, start);
    trained
}

/// The initial parameters of every reference [`single_with`] trained, by the reference's
/// fingerprint: what [`assert_close`] measures changes from.
static STARTS: LazyLock<Mutex<HashMap<u64, Vec<Vec<f32>>>>> = LazyLock::new(Mutex::default);

fn key(params: &[Vec<f32>]) -> u64 {
    fingerprint_values(&params.concat())
}

fn remember_start(trained: &[Vec<f32>], start: Vec<Vec<f32>>) {
    STARTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key(trained), start);
}

/// The initial parameters `reference` was trained from, if [`single_with`] trained it.
pub(crate) fn start_of(reference: &[Vec<f32>]) -> Option<Vec<Vec<f32>>> {
    STARTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key(reference))
        .cloned()
}

/// The samples of each step, concatenated over replicas, as one source.
pub(crate) struct Concatenated {
    pub inner: SyntheticImages,
    pub order: Vec<usize>,
}

impl ImageSource for Concatenated {
    fn len(&self) -> usize {
        self.order.len()
    }
    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        self.inner.get(self.order[index])
    }
}

pub(crate) struct Setup {
    /// One replica per entry.
    pub devices: Vec<Device>,
    pub batch: usize,
    pub micro: usize,
    pub overlapped: bool,
    pub config: DdpConfig,
    /// Batch norm in the model.
    pub batch_norm: bool,
    pub schedule: Schedule,
    /// Shard weights of the loader (uneven shares).
    pub weights: Option<Vec<f64>>,
    /// Per-replica batch sizes instead of `batch`.
    pub batches: Option<Vec<usize>>,
}

impl Setup {
    /// `world` CPU replicas with `batch` samples each.
    pub(crate) fn new(world: usize, batch: usize) -> Self {
        Self {
            devices: vec![Device::flex(); world],
            batch,
            micro: 1,
            overlapped: true,
            config: DdpConfig::default(),
            batch_norm: false,
            schedule: Schedule::default(),
            weights: None,
            batches: None,
        }
    }
}

/// Trains `setup.world` replicas; returns every replica's final parameters.
pub(crate) fn replicated(setup: &Setup) -> Vec<Vec<Vec<f32>>> {
    replicated_with(setup, |device| TinyNet::build(device, setup.batch_norm))
}

/// [`replicated`] for any segmented model `build` makes (identically on every call).
pub(crate) fn replicated_with<M>(
    setup: &Setup,
    build: impl Fn(&Device) -> M + Sync,
) -> Vec<Vec<Vec<f32>>>
where
    M: ImageClassifier + Segmented<Input = Tensor<4>, Output = Tensor<2>>,
    M::Hidden: std::ops::Add<Output = M::Hidden>,
{
    replicated_runs(setup, build)
        .into_iter()
        .map(|run| run.params)
        .collect()
}

/// What one replica of [`replicated_runs`] ended with.
pub(crate) struct ReplicaRun {
    /// Its final parameters.
    pub params: Vec<Vec<f32>>,
    /// Its step's synchronisation statistics.
    pub stats: crate::SyncStats,
    /// Communicator operations submitted while training (the start's broadcast not counted).
    pub operations: usize,
}

/// [`replicated_with`], with every replica's synchronisation statistics and operations.
pub(crate) fn replicated_runs<M>(
    setup: &Setup,
    build: impl Fn(&Device) -> M + Sync,
) -> Vec<ReplicaRun>
where
    M: ImageClassifier + Segmented<Input = Tensor<4>, Output = Tensor<2>>,
    M::Hidden: std::ops::Add<Output = M::Hidden>,
{
    let config = DdpConfig {
        precision: MixedPrecision::new(setup.schedule.precision),
        max_grad_norm: setup.schedule.max_grad_norm,
        ..setup.config.clone()
    };
    DataParallel::new(setup.devices.clone())
        .config(config)
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(build(&device))?;
            let batch = setup
                .batches
                .as_ref()
                .map_or(setup.batch, |b| b[replica.rank()]);
            let mut loader = DataLoader::builder(data())
                .batch_size(batch / setup.micro)
                .shuffle(4)
                .shard(replica.rank(), replica.world_size())
                .device(device);
            if let Some(weights) = &setup.weights {
                loader = loader.shard_weights(weights.clone());
            }
            let step = if setup.overlapped {
                replica.overlapped_step()
            } else {
                replica.non_overlapped_step()
            };
            let stats = step.stats();
            let before = replica.comm().operations();
            let (model, _) = Trainer::builder(model, optimizer())
                .schedule(kiln_train::LrSchedule::constant(setup.schedule.lr))
                .gradient_step(step)
                .train_loader(loader.build())
                .accumulation_steps(setup.micro)
                .max_steps(setup.schedule.steps)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            let operations = replica.comm().operations() - before;
            let stats = *stats.lock().unwrap_or_else(|p| p.into_inner());
            Ok(ReplicaRun {
                params: params(&model),
                stats,
                operations,
            })
        })
        .unwrap()
}
