//! Loader throughput against workers, and the stall fraction while training.

use std::sync::Arc;

use burn::optim::SgdConfig;
use kiln::data::{DataLoader, Transform};
use kiln::train::{LrSchedule, Trainer};

use super::workload::{BATCH, data, devices, model, steps};
use super::{Output, Plot};
use crate::BenchArgs;
use crate::measure::time;
use crate::report::{Figure, Target};
use crate::svg::Series;

const NAME: &str = "loader";

fn transforms() -> Vec<Transform> {
    let mut t = Transform::cifar_augmentation();
    t.push(Transform::cifar_normalize());
    t
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let samples = if args.quick { 2048 } else { 8192 };
    let source = Arc::new(data(samples));
    let mut line = Series {
        name: "CIFAR-shaped, crop+flip+normalize, batch 64".into(),
        points: Vec::new(),
    };
    for workers in [0, 1, 2, 4] {
        let mut loader = DataLoader::builder(Arc::clone(&source))
            .batch_size(64)
            .num_workers(workers)
            .shuffle(1)
            .transforms(transforms())
            .build();
        let mut epoch = 0;
        let s = time(1, if args.quick { 2 } else { 3 }, || {
            for batch in loader.epoch(epoch) {
                std::hint::black_box(batch.expect("batch"));
            }
            epoch += 1;
        });
        let rate = samples as f64 / s.median;
        out.figures.push(
            Figure::new(NAME, format!("{workers} workers: images/s"), rate, "img/s")
                .spread(s.spread),
        );
        line.points.push((workers as f64, rate));
    }
    out.plots.push(Plot {
        file: "loader_throughput",
        title: "Loader throughput",
        x_label: "workers",
        y_label: "images/s",
        log_x: false,
        series: vec![line],
    });

    // Stall: time the training loop waits for batches / its wall time, with 2 workers.
    let (warmup, measured) = steps(args.quick);
    let device = devices(&args.devices)?.remove(0).autodiff();
    let loader = DataLoader::builder(Arc::new(data(BATCH * (warmup + measured) * 2)))
        .batch_size(BATCH)
        .num_workers(2)
        .shuffle(1)
        .transforms(transforms())
        .device(device.clone())
        .build();
    let (_, report) = Trainer::builder(model(&device), SgdConfig::new().init())
        .schedule(LrSchedule::constant(0.05))
        .train_loader(loader)
        .epochs(1)
        .progress(false)
        .log_epochs(false)
        .build()?
        .fit()?;
    let epoch = &report.epochs[0];
    let stall = epoch.data_wait.as_secs_f64() / epoch.elapsed.as_secs_f64();
    out.figures.push(
        Figure::new(NAME, "stall while training (2 workers)", stall, "fraction")
            .target(Target::AtMost(0.01)),
    );
    Ok(out)
}
