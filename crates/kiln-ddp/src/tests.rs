//! Equivalence: N replicas must train exactly like one device on the union of their batches.
//!
//! Tolerance, stated once: after several SGD-with-momentum steps, every parameter tensor of
//! every replica matches the single-device reference to a relative error (max |a−b| over
//! max |b|, per tensor) of 1e-5 in f32; 2e-2 with f16/bf16 compression.

use std::time::{Duration, Instant};

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
use kiln_data::{DataError, DataLoader, ImageItem, ImageSource, SyntheticImages};
use kiln_train::{LocalStep, TrainError, Trainer};

use crate::{Compression, DataParallel, DdpConfig, DdpError, SyncMode};

/// A user's own small model. Without batch norm (the default) per-replica batches are
/// exact; with it, only synchronised batch norm makes replicas match one device.
#[derive(Module, Debug)]
pub(crate) struct TinyNet {
    stem: Conv2d,
    body: Vec<Conv2d>,
    head: Linear,
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

const STEPS: usize = 5;

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
    weights: Option<Vec<f64>>,
    batches: Option<Vec<usize>>,
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

#[test]
fn replicas_match_single_device_on_the_union_of_their_batches() {
    for (world, overlapped) in [(2, true), (3, true), (2, false)] {
        let mut setup = Setup::new(world, 4);
        setup.overlapped = overlapped;
        let reference = single(data(), 4 * world, 1, true);
        assert_close(
            &replicated(&setup),
            &reference,
            1e-5,
            &format!("{world} replicas, overlapped {overlapped}"),
        );
    }
}

#[test]
fn small_buckets_give_the_same_result_as_one_bucket() {
    let mut setup = Setup::new(2, 4);
    setup.config.bucket_cap_bytes = 256;
    setup.config.first_bucket_bytes = 64;
    assert_close(
        &replicated(&setup),
        &single(data(), 8, 1, true),
        1e-5,
        "tiny buckets",
    );
}

#[test]
fn accumulation_syncs_once_and_matches_one_large_batch() {
    let mut setup = Setup::new(2, 8);
    setup.micro = 2;
    assert_close(
        &replicated(&setup),
        &single(data(), 16, 1, true),
        1e-5,
        "2 replicas x 2 micro-batches",
    );
    assert_close(
        &[single(data(), 16, 4, true)],
        &single(data(), 16, 1, true),
        1e-5,
        "local accumulation",
    );
}

#[test]
fn compressed_gradients_match_within_half_precision_tolerance() {
    let reference = single(data(), 8, 1, true);
    for compression in [Compression::F16, Compression::Bf16] {
        let mut setup = Setup::new(2, 4);
        setup.config.compression = compression;
        assert_close(
            &replicated(&setup),
            &reference,
            2e-2,
            &format!("{compression:?}"),
        );
    }
}

/// The samples of each step, concatenated over replicas, as one source.
struct Concatenated {
    inner: SyntheticImages,
    order: Vec<usize>,
}

impl ImageSource for Concatenated {
    fn len(&self) -> usize {
        self.order.len()
    }
    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        self.inner.get(self.order[index])
    }
}

/// The single-device reference for two replicas with `batches` and shard `weights`: each
/// step's samples are rank 0's batch followed by rank 1's.
fn union_reference(batches: &[usize], weights: &[f64]) -> Vec<Vec<f32>> {
    let per_rank: Vec<Vec<Vec<usize>>> = (0..2)
        .map(|rank| {
            DataLoader::builder(data())
                .batch_size(batches[rank])
                .shuffle(4)
                .shard(rank, 2)
                .shard_weights(weights.to_vec())
                .build()
                .batch_indices(0)
        })
        .collect();
    let order = (0..STEPS)
        .flat_map(|s| {
            per_rank[0][s]
                .iter()
                .chain(&per_rank[1][s])
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    single(
        Concatenated {
            inner: data(),
            order,
        },
        batches.iter().sum(),
        1,
        false,
    )
}

#[test]
fn uneven_batches_weighted_by_share_equal_one_large_batch() {
    let weights = vec![1.0, 3.0];
    let batches = vec![2, 6];
    let reference = union_reference(&batches, &weights);
    let mut setup = Setup::new(2, 0);
    setup.weights = Some(weights);
    setup.batches = Some(batches);
    assert_close(&replicated(&setup), &reference, 1e-5, "uneven 2 + 6");
}

#[test]
fn local_sgd_averaging_every_step_equals_synchronous_plain_sgd() {
    // With plain SGD the update is linear in the gradient, so averaging parameters after every
    // local step is the same as averaging gradients.
    let run = |mode| {
        DataParallel::new(vec![Device::flex(); 2])
            .config(DdpConfig {
                mode,
                ..DdpConfig::default()
            })
            .run(|replica| {
                let device = replica.train_device();
                let model = replica.broadcast_module(TinyNet::new(&device))?;
                let loader = DataLoader::builder(data())
                    .batch_size(4)
                    .shard(replica.rank(), 2)
                    .device(device)
                    .build();
                let (model, _) = Trainer::builder(model, SgdConfig::new().init())
                    .gradient_step(replica.overlapped_step())
                    .schedule(kiln_train::LrSchedule::constant(0.2))
                    .train_loader(loader)
                    .max_steps(STEPS)
                    .progress(false)
                    .log_epochs(false)
                    .build()?
                    .fit()?;
                replica.check_divergence(&model)?;
                Ok(params(&model))
            })
            .unwrap()
    };
    let synchronous = run(SyncMode::Gradients);
    let local = run(SyncMode::LocalSgd { period: 1 });
    assert_close(&local, &synchronous[0], 1e-5, "local SGD, period 1");
    let drifting = run(SyncMode::LocalSgd { period: 3 });
    assert_close(
        &drifting[1..],
        &drifting[0],
        0.0,
        "averaged at the end of a period",
    );
}

#[test]
fn batch_norm_statistics_are_identical_after_evaluation_sync() {
    let results = DataParallel::new(vec![Device::flex(); 2])
        .config(DdpConfig {
            divergence_check_every: 2,
            ..DdpConfig::default()
        })
        .run(|replica| {
            let device = replica.train_device();
            let model = kiln_resnet::ResNetConfig::resnet18(4)
                .with_stem(kiln_resnet::StemKind::Cifar)
                .with_base_width(2)
                .init(&device);
            let model = replica.broadcast_module(model)?;
            let loader = DataLoader::builder(data())
                .batch_size(6)
                .shuffle(1)
                .shard(replica.rank(), 2)
                .device(device)
                .build();
            let mut builder = Trainer::builder(model, optimizer())
                .gradient_step(replica.overlapped_step())
                .train_loader(loader)
                .max_steps(4)
                .progress(false)
                .log_epochs(false);
            if replica.is_primary() {
                // Evaluation on one replica settles its batch-norm state; the others must agree.
                builder = builder.valid_loader(DataLoader::builder(data()).batch_size(60).build());
            }
            let (model, _) = builder.build()?.fit()?;
            // The per-epoch sync ran (the epoch ended): running statistics agree bit for bit.
            replica.check_divergence(&model)?;
            Ok(())
        });
    results.unwrap();
}

#[test]
fn a_planted_parameter_mismatch_is_caught_and_named() {
    let result = DataParallel::new(vec![Device::flex(); 3]).run(|replica| {
        let device = replica.device().clone();
        let mut model = replica.broadcast_module(TinyNet::new(&device))?;
        if replica.rank() == 2 {
            let weight = model.body[1].weight.clone().map(|w| w.add_scalar(1e-7));
            model.body[1].weight = weight;
        }
        replica.check_divergence(&model)
    });
    match result {
        Err(DdpError::Replica {
            source: TrainError::Diverged(message),
            ..
        }) => {
            assert!(
                message.contains("body.1.weight") && message.contains("[2]"),
                "{message}"
            );
        }
        other => panic!("expected a divergence error, got {other:?}"),
    }
}

#[test]
fn a_panicking_replica_stops_the_run_with_its_error_promptly() {
    // Plain, and with synchronised batch norm (the others then wait in a statistics
    // all-reduce inside forward).
    for sync_batch_norm in [false, true] {
        panicking_replica_run(sync_batch_norm);
    }
}

fn panicking_replica_run(sync_batch_norm: bool) {
    let start = Instant::now();
    let result = DataParallel::new(vec![Device::flex(); 3])
        .config(DdpConfig {
            timeout: Duration::from_secs(60),
            sync_batch_norm,
            ..DdpConfig::default()
        })
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(TinyNet::build(&device, sync_batch_norm))?;
            let loader = DataLoader::builder(data())
                .batch_size(4)
                .shard(replica.rank(), 3)
                .device(device)
                .build();
            let mut step = replica.overlapped_step();
            if replica.rank() == 1 {
                if sync_batch_norm {
                    // Before any step: the others wait in the first statistics all-reduce.
                    // (Not after a step: a BN model ending training early averages its
                    // running statistics, a collective the others would not match.)
                    panic!("replica 1 exploded");
                }
                // Fails after one good step, while the others wait in the next all-reduce.
                let (_, _) = Trainer::builder(model, optimizer())
                    .gradient_step(step)
                    .train_loader(loader)
                    .max_steps(1)
                    .progress(false)
                    .log_epochs(false)
                    .build()?
                    .fit()?;
                panic!("replica 1 exploded");
            }
            step = replica.overlapped_step();
            Trainer::builder(model, optimizer())
                .gradient_step(step)
                .train_loader(loader)
                .max_steps(50)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            Ok(())
        });
    match result {
        Err(DdpError::Panicked { rank: 1, message }) => assert!(message.contains("exploded")),
        other => panic!("expected replica 1's panic, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

/// Two independent runs in concurrent threads equal a sequential one: model initialisation
/// is race-free ([`init_module`] materialises Burn's lazy parameters under the seed lock).
#[test]
fn concurrent_independent_runs_match_a_sequential_one() {
    let run = || {
        let device = Device::flex().autodiff();
        let loader = DataLoader::builder(data())
            .batch_size(4)
            .device(device.clone())
            .build();
        let (model, _) = Trainer::builder(TinyNet::new(&device), optimizer())
            .schedule(kiln_train::LrSchedule::constant(0.2))
            .train_loader(loader)
            .max_steps(STEPS)
            .progress(false)
            .log_epochs(false)
            .build()
            .unwrap()
            .fit()
            .unwrap();
        params(&model)
    };
    let reference = run();
    for _ in 0..4 {
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2).map(|_| s.spawn(run)).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            results.iter().all(|r| *r == reference),
            "a concurrent run differs from the sequential one"
        );
    }
}

#[test]
fn zero1_shards_optimizer_state_and_matches_single_device() {
    let reference = single(data(), 12, 1, true);
    let mut setup = Setup::new(3, 4);
    setup.config.zero1 = true;
    assert_close(&replicated(&setup), &reference, 1e-5, "ZeRO-1, 3 replicas");
}

#[test]
fn measured_throughput_sizes_batches_and_training_stays_exact() {
    // Replica 1 "measures" three times replica 0's speed: it gets three times the batch, and
    // the run equals one device on the union of each step's samples.
    let splits = DataParallel::new(vec![Device::flex(); 2])
        .run(|replica| replica.split_batch(if replica.rank() == 0 { 100.0 } else { 300.0 }, 8))
        .unwrap();
    assert!(
        splits
            .iter()
            .all(|s| s.batches == vec![2, 6] && s.throughput == vec![100.0, 300.0])
    );
    let weights = splits[0].weights();
    let reference = union_reference(&splits[0].batches, &weights);
    let mut setup = Setup::new(2, 0);
    setup.weights = Some(weights);
    setup.batches = Some(splits[0].batches.clone());
    assert_close(
        &replicated(&setup),
        &reference,
        1e-5,
        "throughput-balanced 2 + 6",
    );
}
