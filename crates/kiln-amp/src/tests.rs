//! AMP's promises: skipped overflow steps, scale growth on schedule, f16/bf16 training close to
//! f32 with f32 master weights, and data-parallel AMP equal to single-replica AMP.
//!
//! Tolerances: after 60 steps, the validation loss (1024 held-out samples, f32 evaluation) of the f16/bf16 run is within 0.1 (absolute)
//! of the f32 run's; AMP with 2 replicas matches AMP with 1 replica on the doubled batch
//! to a per-tensor relative error of 1e-2 (the replicas reduce f32 gradients of half-precision
//! computations, so the sums round differently than one large batch does).

use burn::module::Module;
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::{DType, Device};
use kiln_core::{FlatLayout, init_module, param_infos, read_params};
use kiln_data::{DataLoader, SyntheticImages};
use kiln_resnet::{ResNet, ResNetConfig, StemKind};
use kiln_train::{LrSchedule, TrainReport, Trainer};

use crate::{AmpPolicy, AmpStep, GradScaler, GradScalerConfig, Precision, module_dtypes};

fn model(device: &Device) -> ResNet {
    init_module(device, 3, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(4)
            .init(device)
    })
}

fn data() -> SyntheticImages {
    SyntheticImages::new(512, 4, 2, [3, 8, 8]).with_noise(0.5)
}

/// Trainable parameters (the forward of a skipped step still updates batch-norm statistics,
/// as in PyTorch).
fn params<M: Module>(model: &M) -> Vec<f32> {
    read_params(
        model,
        &FlatLayout::new(param_infos(model).into_iter().filter(|p| p.trainable)),
    )
}

fn train(step: AmpStep, steps: usize) -> (ResNet, TrainReport) {
    let device = Device::flex().autodiff();
    Trainer::builder(
        model(&device),
        SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
            .init(),
    )
    .gradient_step(step)
    .schedule(LrSchedule::constant(0.02))
    .train_loader(
        DataLoader::builder(data())
            .batch_size(32)
            .shuffle(1)
            .device(device)
            .build(),
    )
    .max_steps(steps)
    .progress(false)
    .log_epochs(false)
    .build()
    .unwrap()
    .fit()
    .unwrap()
}

#[test]
fn scaler_halves_on_overflow_and_doubles_after_exactly_the_interval() {
    let mut scaler = GradScaler::new(GradScalerConfig {
        growth_interval: 3,
        ..GradScalerConfig::default()
    });
    assert!(!scaler.update(true), "a non-finite step is skipped");
    assert_eq!(scaler.scale(), 32768.0);
    assert!(scaler.update(false) && scaler.update(false));
    assert_eq!(scaler.scale(), 32768.0, "not before the interval");
    assert!(scaler.update(false));
    assert_eq!(scaler.scale(), 65536.0, "exactly after it");
    assert_eq!(scaler.growth_tracker(), 0);
    let saved = serde_json::to_string(&scaler).unwrap();
    assert_eq!(
        serde_json::from_str::<GradScaler>(&saved).unwrap(),
        scaler,
        "the scaler round-trips through a checkpoint"
    );
}

#[test]
fn a_planted_overflow_skips_the_step_halves_the_scale_and_leaves_parameters_unchanged() {
    // A scale of 2^40 overflows f16 gradients (max 65504) on the first backward.
    let scaler = GradScaler::new(GradScalerConfig {
        init_scale: 2f32.powi(40),
        ..GradScalerConfig::default()
    });
    let step = AmpStep::new(Precision::F16).with_scaler(scaler);
    let stats = step.stats();
    let before = params(&model(&Device::flex().autodiff()));
    let (trained, _) = train(step, 1);
    assert_eq!(
        params(&trained),
        before,
        "the skipped step changed nothing (not even momentum could)"
    );
    let stats = *stats.lock().unwrap();
    assert_eq!((stats.steps, stats.skipped), (1, 1));
    assert_eq!(stats.scale, 2f32.powi(39));
}

#[test]
fn half_precision_training_reaches_the_f32_loss_with_f32_master_weights() {
    let steps = 60;
    let valid = |model: &ResNet| {
        let mut loader = DataLoader::builder(data().split(1024, 9))
            .batch_size(256)
            .build();
        kiln_train::evaluate(&model.valid(), &mut loader)
            .unwrap()
            .loss
    };
    let (full_model, full) = train(AmpStep::new(Precision::F32), steps);
    let want = valid(&full_model);
    assert!(
        want < 0.3 * full.losses()[0],
        "f32 learns: {} -> {want}",
        full.losses()[0]
    );
    let variants = [
        (Precision::F16, AmpPolicy::default()),
        (Precision::Bf16, AmpPolicy::default()),
        (Precision::Bf16, AmpPolicy::cast_everything()),
    ];
    for (precision, policy) in variants {
        let step = AmpStep::new(precision).with_policy(policy);
        let stats = step.stats();
        let (model, _) = train(step, steps);
        let got = valid(&model);
        assert!(
            (got - want).abs() <= 0.1,
            "{precision}: validation loss {got} vs f32 {want}"
        );
        assert!(
            module_dtypes(&model).iter().all(|d| *d == DType::F32),
            "{precision}: master weights are f32"
        );
        // Dynamic scaling may skip a step or two while the scale finds its level.
        assert!(
            stats.lock().unwrap().skipped <= 2,
            "{precision}: {:?}",
            stats.lock().unwrap()
        );
    }
}

/// A small convolutional model without batch norm: per-replica batch statistics would make
/// 2 × b differ from 1 × 2b for reasons that have nothing to do with AMP.
#[derive(Module, Debug)]
struct Plain {
    conv1: burn::nn::conv::Conv2d,
    conv2: burn::nn::conv::Conv2d,
    fc: burn::nn::Linear,
}

impl Plain {
    fn new(device: &Device) -> Self {
        let conv = |i, o| {
            burn::nn::conv::Conv2dConfig::new([i, o], [3, 3])
                .with_padding(burn::nn::PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        init_module(device, 5, || Self {
            conv1: conv(3, 8),
            conv2: conv(8, 8),
            fc: burn::nn::LinearConfig::new(8, 4).init(device),
        })
    }
}

impl kiln_core::ImageClassifier for Plain {
    fn forward_logits(&self, images: burn::tensor::Tensor<4>) -> burn::tensor::Tensor<2> {
        use burn::tensor::activation::relu;
        let x = relu(self.conv2.forward(relu(self.conv1.forward(images))));
        let [batch, channels, _, _] = x.dims();
        self.fc
            .forward(x.flatten::<3>(2, 3).mean_dim(2).reshape([batch, channels]))
    }
}

#[test]
fn amp_with_two_replicas_equals_amp_with_one_on_the_doubled_batch() {
    let steps = 4;
    let run = |replicas: usize, batch: usize| {
        kiln_ddp::DataParallel::new(vec![Device::flex(); replicas])
            .run(|replica| {
                let device = replica.train_device();
                let model = replica.broadcast_module(Plain::new(&device))?;
                let loader = DataLoader::builder(data())
                    .batch_size(batch)
                    .shuffle(1)
                    .shard(replica.rank(), replicas)
                    .device(device)
                    .build();
                let (model, _) = Trainer::builder(
                    model,
                    SgdConfig::new()
                        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
                        .init(),
                )
                .gradient_step(AmpStep::new(Precision::Bf16).data_parallel(replica.comm()))
                .schedule(LrSchedule::constant(0.05))
                .train_loader(loader)
                .max_steps(steps)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
                Ok(model)
            })
            .unwrap()
    };
    let single = run(1, 16).remove(0);
    let pair = run(2, 8);
    let layout = FlatLayout::new(param_infos(&single).into_iter().filter(|p| p.trainable));
    let want = read_params(&single, &layout);
    for replica in &pair {
        let got = read_params(replica, &layout_of(replica));
        for entry in layout.entries() {
            let range = entry.offset..entry.offset + entry.info.numel();
            let scale = want[range.clone()]
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()))
                .max(1e-6);
            let error = got[range.clone()]
                .iter()
                .zip(&want[range])
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
                / scale;
            assert!(error <= 1e-2, "{}: relative error {error}", entry.info.path);
        }
    }
}

fn layout_of(model: &Plain) -> FlatLayout {
    FlatLayout::new(param_infos(model).into_iter().filter(|p| p.trainable))
}

#[test]
fn an_overflow_on_one_replica_skips_the_step_on_every_replica() {
    let results = kiln_ddp::DataParallel::new(vec![Device::flex(); 2])
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(Plain::new(&device))?;
            let before = params(&model);
            // Only replica 1 overflows (2^40 × its f16 gradients); replica 0's are finite.
            let scale = if replica.rank() == 1 {
                2f32.powi(40)
            } else {
                1024.0
            };
            let step = AmpStep::new(Precision::F16)
                .with_scaler(GradScaler::new(GradScalerConfig {
                    init_scale: scale,
                    ..GradScalerConfig::default()
                }))
                .data_parallel(replica.comm());
            let stats = step.stats();
            let loader = DataLoader::builder(data())
                .batch_size(8)
                .shard(replica.rank(), 2)
                .device(device)
                .build();
            let (model, _) = Trainer::builder(model, SgdConfig::new().init())
                .gradient_step(step)
                .train_loader(loader)
                .max_steps(1)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            let stats = *stats.lock().unwrap();
            Ok((params(&model) == before, stats.skipped, stats.scale / scale))
        })
        .unwrap();
    for (unchanged, skipped, scale_ratio) in results {
        assert!(unchanged, "parameters unchanged on every replica");
        assert_eq!(
            (skipped, scale_ratio),
            (1, 0.5),
            "every replica skipped and halved its scale"
        );
    }
}
