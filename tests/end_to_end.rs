//! End to end through the `kiln` facade: two data-parallel replicas with mixed precision
//! train a ResNet on synthetic data, stay identical, and learn.
//!
//! The one integration-test binary of the workspace (each file under `tests/` is a separate
//! binary to build, so behaviour tests live beside the code they test).

use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::Device;
use kiln::amp::{MixedPrecision, Precision};
use kiln::core::init_module;
use kiln::data::{DataLoader, SyntheticImages};
use kiln::ddp::{DataParallel, DdpConfig};
use kiln::resnet::{ResNetConfig, StemKind};
use kiln::train::{LrSchedule, Trainer};

#[test]
fn two_bf16_replicas_learn_and_stay_identical() {
    let data = SyntheticImages::new(384, 4, 11, [3, 8, 8]).with_noise(0.5);
    let valid = data.split(128, 3);
    let config = DdpConfig {
        precision: MixedPrecision::new(Precision::Bf16),
        ..DdpConfig::default()
    };
    let reports = DataParallel::new(vec![Device::flex(), Device::flex()])
        .config(config)
        .run(|replica| {
            let device = replica.train_device();
            let model = init_module(&device, 7, || {
                ResNetConfig::resnet18(4)
                    .with_stem(StemKind::Cifar)
                    .with_base_width(4)
                    .init(&device)
            });
            let model = replica.broadcast_module(model)?;
            let loader = DataLoader::builder(data.clone())
                .batch_size(16)
                .shuffle(5)
                .num_workers(1)
                .shard(replica.rank(), replica.world_size())
                .device(device)
                .build();
            let mut builder = Trainer::builder(
                model,
                SgdConfig::new()
                    .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
                    .init(),
            )
            .gradient_step(replica.overlapped_step())
            .schedule(LrSchedule::constant(0.05).warmup(3))
            .train_loader(loader)
            .epochs(3)
            .progress(false)
            .log_epochs(false);
            if replica.is_primary() {
                builder =
                    builder.valid_loader(DataLoader::builder(valid.clone()).batch_size(64).build());
            }
            let (model, report) = builder.build()?.fit()?;
            // Synchronous data parallelism keeps the parameters bit-identical.
            replica.check_divergence(&model)?;
            Ok(report)
        })
        .expect("training");
    let report = &reports[0];
    let first = report.losses()[0];
    let last = report.epochs.last().unwrap().train_loss;
    assert!(last < 0.7 * first, "loss should fall: {first} -> {last}");
    assert!(
        report.final_valid_accuracy().unwrap() > 0.5,
        "{:?}",
        report.epochs.last()
    );
}
