//! Training throughput of kiln's data-parallel step for a model width, replica count and
//! threads per replica: what the thread-scaling and PyTorch-peer benchmarks measure.

use std::sync::Arc;

use burn::tensor::Device;
use kiln::data::DataLoader;
use kiln::ddp::{DataParallel, DdpConfig, SyncStats};
use kiln::train::{LrSchedule, Trainer};

use super::workload::{BATCH, data, median_step_seconds, optimizer, replica_devices, resnet_of};
use crate::measure::Stats;

/// One configuration.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub width: usize,
    pub replicas: usize,
    pub threads: usize,
}

/// Images/s over all replicas (rank 0's median step time) and its step-time spread.
pub fn images_per_sec(
    devices: &[Device],
    setting: Setting,
    warmup: usize,
    measured: usize,
) -> Result<(f64, Stats), Box<dyn std::error::Error>> {
    let config = DdpConfig {
        threads_per_replica: Some(setting.threads),
        ..DdpConfig::default()
    };
    let (step, _) = train_replicas(
        devices,
        setting.replicas,
        setting.width,
        config,
        warmup,
        measured,
    )?;
    Ok(((setting.replicas * BATCH) as f64 / step.median, step))
}

/// Trains `replicas` overlapped data-parallel replicas of ResNet-18 (CIFAR stem, base width
/// `width`) with SGD momentum for warm-up + measured steps; rank 0's step-time statistics and
/// synchronisation statistics.
pub fn train_replicas(
    devices: &[Device],
    replicas: usize,
    width: usize,
    config: DdpConfig,
    warmup: usize,
    measured: usize,
) -> Result<(Stats, SyncStats), Box<dyn std::error::Error>> {
    train_resnet_replicas(devices, replicas, 18, width, config, (warmup, measured))
}

/// [`train_replicas`] for ResNet-`depth`; `steps` is (warm-up, measured).
pub fn train_resnet_replicas(
    devices: &[Device],
    replicas: usize,
    depth: usize,
    width: usize,
    config: DdpConfig,
    steps: (usize, usize),
) -> Result<(Stats, SyncStats), Box<dyn std::error::Error>> {
    let (warmup, measured) = steps;
    let source = Arc::new(data(BATCH * replicas * (warmup + measured)));
    let results = DataParallel::new(replica_devices(devices, replicas))
        .config(config)
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(resnet_of(&device, depth, width))?;
            let loader = DataLoader::builder(Arc::clone(&source))
                .batch_size(BATCH)
                .num_workers(1)
                .shard(replica.rank(), replica.world_size())
                .device(device)
                .build();
            let optimizer = optimizer();
            let step = replica.overlapped_step();
            let stats = step.stats();
            let (_, report) = Trainer::builder(model, optimizer)
                .gradient_step(step)
                .schedule(LrSchedule::constant(0.05))
                .train_loader(loader)
                .max_steps(warmup + measured)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            let stats = *stats.lock().unwrap_or_else(|p| p.into_inner());
            Ok((median_step_seconds(&report, warmup), stats))
        })?;
    Ok(results.into_iter().next().expect("rank 0"))
}

/// The machine's cores.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
