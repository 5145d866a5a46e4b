//! kiln's single-replica training step against a hand-written Burn loop.

use std::sync::Arc;
use std::time::Instant;

use burn::optim::GradientsParams;
use burn::tensor::Device;
use kiln::data::DataLoader;
use kiln::train::{LrSchedule, Trainer, classification_loss};

use super::Output;
use super::workload::{BATCH, data, devices, median_step_seconds, model, optimizer, steps};
use crate::BenchArgs;
use crate::measure::{Stats, stats};
use crate::report::{Figure, Target};

const NAME: &str = "overhead";

fn kiln_step(device: &Device, quick: bool) -> Result<Stats, Box<dyn std::error::Error>> {
    let (warmup, measured) = steps(quick);
    let device = device.clone().autodiff();
    let loader = DataLoader::builder(Arc::new(data(BATCH * (warmup + measured))))
        .batch_size(BATCH)
        .num_workers(1)
        .device(device.clone())
        .build();
    let (_, report) = Trainer::builder(model(&device), optimizer())
        .schedule(LrSchedule::constant(0.05))
        .train_loader(loader)
        .max_steps(warmup + measured)
        .progress(false)
        .log_epochs(false)
        .build()?
        .fit()?;
    Ok(median_step_seconds(&report, warmup))
}

/// The loop a Burn user writes by hand, on batches prepared in memory beforehand.
fn hand_written_step(device: &Device, quick: bool) -> Result<Stats, Box<dyn std::error::Error>> {
    let (warmup, measured) = steps(quick);
    let device = device.clone().autodiff();
    let mut loader = DataLoader::builder(data(BATCH * (warmup + measured)))
        .batch_size(BATCH)
        .device(device.clone())
        .build();
    let batches: Vec<_> = loader.epoch(0).collect::<Result<_, _>>()?;
    let mut model = model(&device);
    let mut optimizer = optimizer();
    let mut samples = Vec::new();
    for (i, batch) in batches.into_iter().enumerate() {
        let start = Instant::now();
        let loss = classification_loss(model.forward(batch.images), batch.labels);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(0.05, model, grads);
        std::hint::black_box(loss.into_scalar::<f32>());
        if i >= warmup {
            samples.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(stats(samples))
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    // Alternate the two so that drifting machine load hits both alike.
    let rounds = if args.quick { 1 } else { 3 };
    let device = devices(&args.devices)?.remove(0);
    let (mut kiln, mut hand) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        kiln.push(kiln_step(&device, args.quick)?.median);
        hand.push(hand_written_step(&device, args.quick)?.median);
    }
    let (kiln, hand) = (stats(kiln), stats(hand));
    let mut out = Output::default();
    out.figures.push(
        Figure::new(NAME, "hand-written Burn step", hand.median * 1e3, "ms").spread(hand.spread),
    );
    out.figures.push(
        Figure::new(
            NAME,
            "kiln Trainer step (1 replica)",
            kiln.median * 1e3,
            "ms",
        )
        .spread(kiln.spread),
    );
    out.figures.push(
        Figure::new(
            NAME,
            "kiln step / hand-written step",
            kiln.median / hand.median,
            "ratio",
        )
        .spread(kiln.spread.max(hand.spread))
        .target(Target::AtMost(1.02)),
    );
    Ok(out)
}
