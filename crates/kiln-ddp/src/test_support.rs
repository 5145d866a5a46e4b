//! What the equivalence tests share: a small user model (with optional batch norm), the
//! single-device reference, N-replica runs and the comparison.
//!
//! Tolerance, stated once: after several SGD-with-momentum steps, every parameter tensor of
//! every replica matches the single-device reference to a relative error (max |a−b| over
//! max |b|, per tensor) of 1e-5 in f32; 2e-2 with f16/bf16 compression.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use kiln_core::{
    FlatLayout, ImageClassifier, SegmentId, Segmented, init_module, param_infos, read_params,
};
use kiln_data::{DataLoader, ImageSource, SyntheticImages};
use kiln_train::{LocalStep, Trainer};

use crate::{DataParallel, DdpConfig};

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
        let conv = |i, o| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        init_module(device, 11, || Self {
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

    /// Batch norm `index` (synchronised in a synchronised pass), if the model has them.
    fn norm(&self, index: usize, x: Tensor<4>) -> Tensor<4> {
        match &self.norms {
            Some(norms) => kiln_core::sync_batch_norm(&norms[index], x),
            None => x,
        }
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

/// How long and how fast the equivalence runs train.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub steps: usize,
    pub lr: f64,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            steps: STEPS,
            lr: 0.2,
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
    let (model, _) = Trainer::builder(build(&device), optimizer())
        .gradient_step(LocalStep)
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
    params(&model)
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
    DataParallel::new(setup.devices.clone())
        .config(setup.config.clone())
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
            let builder = Trainer::builder(model, optimizer())
                .schedule(kiln_train::LrSchedule::constant(setup.schedule.lr))
                .train_loader(loader.build())
                .accumulation_steps(setup.micro)
                .max_steps(setup.schedule.steps)
                .progress(false)
                .log_epochs(false);
            let model = if setup.overlapped {
                builder
                    .gradient_step(replica.overlapped_step())
                    .build()?
                    .fit()?
                    .0
            } else {
                builder
                    .gradient_step(replica.gradient_step())
                    .build()?
                    .fit()?
                    .0
            };
            Ok(params(&model))
        })
        .unwrap()
}

pub(crate) fn assert_close(
    replicas: &[Vec<Vec<f32>>],
    reference: &[Vec<f32>],
    tolerance: f32,
    what: &str,
) {
    for (rank, tensors) in replicas.iter().enumerate() {
        for (index, (got, want)) in tensors.iter().zip(reference).enumerate() {
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
            let error = got
                .iter()
                .zip(want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
                / scale;
            if error > tolerance {
                let all: Vec<f32> = tensors
                    .iter()
                    .zip(reference)
                    .map(|(g, w)| {
                        g.iter()
                            .zip(w)
                            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
                    })
                    .collect();
                panic!(
                    "{what}: replica {rank}, tensor {index}: relative error {error:e} > {tolerance:e}; all {all:?}"
                );
            }
        }
    }
    // And something actually trained.
    let initial = params(&TinyNet::new(&Device::flex()));
    assert_ne!(initial, reference, "{what}: the reference did not move");
}
