//! Data-parallel step time with and without gradient sync; throughput against replicas.

use burn::tensor::Device;
use kiln::ddp::{DdpConfig, GradientPath, SyncMode, SyncStats};

use super::throughput::train_replicas;
use super::workload::{BATCH, devices, steps};
use super::{Output, Plot};
use crate::BenchArgs;
use crate::measure::Stats;
use crate::report::{Figure, Target};
use crate::svg::Series;

const NAME: &str = "ddp";

/// Trains `replicas` replicas of the example's model (width 8) for warm-up + measured steps;
/// returns rank 0's step-time stats and sync statistics.
fn train(
    devices: &[Device],
    replicas: usize,
    config: DdpConfig,
    quick: bool,
) -> Result<(Stats, SyncStats), Box<dyn std::error::Error>> {
    let (warmup, measured) = steps(quick);
    train_replicas(devices, replicas, 8, config, warmup, measured)
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let devices = devices(&args.devices)?;
    let synchronous = DdpConfig::default();
    let (synced, sync_stats) = train(&devices, 2, synchronous.clone(), args.quick)?;
    let skip = DdpConfig {
        mode: SyncMode::Unsynchronized,
        ..DdpConfig::default()
    };
    let (skipped, _) = train(&devices, 2, skip, args.quick)?;
    // Small buckets split the example model's 0.7 MB of gradients, so all-reduce can start
    // while earlier segments are still in backward.
    let small = DdpConfig {
        bucket_cap_bytes: 64 << 10,
        first_bucket_bytes: 16 << 10,
        ..DdpConfig::default()
    };
    let (overlapped, small_stats) = train(&devices, 2, small.clone(), args.quick)?;
    out.figures.push(
        Figure::new(
            NAME,
            "2 replicas, 64 KiB buckets: step / sync skipped",
            overlapped.median / skipped.median,
            "ratio",
        )
        .spread(overlapped.spread.max(skipped.spread)),
    );
    out.figures.push(Figure::new(
        NAME,
        "2 replicas, 64 KiB buckets: communication hidden",
        small_stats.hidden_fraction(),
        "fraction",
    ));
    // Gradients kept as device tensors, buckets concatenated on the device and staged
    // through the host: what GPUs without a native collective do. On the CPU it only adds
    // work (the host buffer is the natural path there); the figure prices that work.
    let on_device = DdpConfig {
        gradient_path: GradientPath::Device,
        ..small
    };
    let (device_path, _) = train(&devices, 2, on_device, args.quick)?;
    out.figures.push(
        Figure::new(
            NAME,
            "2 replicas, 64 KiB buckets: device / host gradients",
            device_path.median / overlapped.median,
            "ratio",
        )
        .spread(device_path.spread.max(overlapped.spread)),
    );
    // Synchronised batch norm: per-layer statistics all-reduces and, in backward, one replay
    // of each residual block's forward (see kiln_core::sync_norm).
    let synced_bn = DdpConfig {
        sync_batch_norm: true,
        ..synchronous.clone()
    };
    let (synced_bn_step, _) = train(&devices, 2, synced_bn, args.quick)?;
    out.figures.push(
        Figure::new(
            NAME,
            "2 replicas: sync-BN step / plain step",
            synced_bn_step.median / synced.median,
            "ratio",
        )
        .spread(synced_bn_step.spread.max(synced.spread)),
    );
    out.figures.push(
        Figure::new(
            NAME,
            "2 replicas: step with sync / sync skipped",
            synced.median / skipped.median,
            "ratio",
        )
        .spread(synced.spread.max(skipped.spread))
        .target(Target::AtMost(1.05)),
    );
    out.figures.push(Figure::new(
        NAME,
        "2 replicas: communication hidden by backward",
        sync_stats.hidden_fraction(),
        "fraction",
    ));
    let mut line = Series {
        name: "ResNet-18 w8, batch 32/replica".into(),
        points: Vec::new(),
    };
    let mut single = None;
    for replicas in [1, 2, 4] {
        let (s, _) = train(&devices, replicas, synchronous.clone(), args.quick)?;
        let images = (replicas * BATCH) as f64 / s.median;
        let base = *single.get_or_insert(images);
        out.figures.push(
            Figure::new(
                NAME,
                format!("{replicas} replica(s): images/s"),
                images,
                "img/s",
            )
            .spread(s.spread),
        );
        out.figures.push(Figure::new(
            NAME,
            format!("{replicas} replica(s): speed-up over 1"),
            images / base,
            "ratio",
        ));
        line.points.push((replicas as f64, images));
    }
    out.plots.push(Plot {
        file: "ddp_throughput",
        title: "Data-parallel throughput (in-process replicas, one CPU)",
        x_label: "replicas",
        y_label: "images/s",
        log_x: false,
        series: vec![line],
    });
    Ok(out)
}
