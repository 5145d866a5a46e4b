//! Checkpoints: write and load speed against the disk's own sequential write speed measured
//! in the same run, checkpoint sizes, and what writing checkpoints costs a training run
//! (the write runs on a thread of its own).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::optim::GradientsParams;
use burn::tensor::{Device, Distribution, Int, Tensor};
use kiln::checkpoint::{CheckpointStore, Checkpointer, RunIdentity, resume};
use kiln::core::ImageClassifier;
use kiln::data::DataLoader;
use kiln::train::{LrSchedule, TrainPosition, Trainer, classification_loss};

use super::Output;
use super::workload::{BATCH, data, optimizer, resnet_of};
use crate::BenchArgs;
use crate::report::{Figure, Target};

const NAME: &str = "checkpoint";

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from("target").join("bench-checkpoint").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// MB/s of writing `mb` megabytes in 8 MB chunks to a new file in `dir`, synced.
fn disk_write_speed(dir: &Path, mb: usize) -> Result<f64, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("sequential.bin");
    let chunk = vec![0x5au8; 8 << 20];
    let start = Instant::now();
    let mut file = std::fs::File::create(&path)?;
    for _ in 0..mb.div_ceil(8) {
        file.write_all(&chunk)?;
    }
    file.sync_all()?;
    let seconds = start.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok((mb.div_ceil(8) * 8) as f64 * 1.048_576 / seconds)
}

fn bytes_of(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Save and load figures for ResNet-`depth` of base width `width`, with momentum state.
fn save_and_load(
    out: &mut Output,
    depth: usize,
    width: usize,
    disk: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let label = format!("resnet{depth} w{width}");
    let device = Device::flex().autodiff();
    let model = resnet_of(&device, depth, width);
    // One step, so that the optimizer holds its momentum for every parameter.
    let images = Tensor::<4>::random([2, 3, 32, 32], Distribution::Normal(0.0, 1.0), &device);
    let labels = Tensor::<1, Int>::from_ints([0, 1], &device);
    let grads = GradientsParams::from_grads(
        classification_loss(model.forward_logits(images), labels).backward(),
        &model,
    );
    let mut optim = optimizer();
    let model = optim.step(0.01, model, grads);
    let dir = scratch(&label);
    let identity = RunIdentity::new(label.clone());
    let saver = Checkpointer::new(CheckpointStore::new(&dir, 1), 0, identity.clone());
    let position = TrainPosition::default();
    let start = Instant::now();
    let path = saver.save_now(&position, &model, &optim)?;
    let save = start.elapsed().as_secs_f64();
    let size = bytes_of(&path) as f64 / 1e6;
    let start = Instant::now();
    let resumed = resume(
        &path,
        &identity,
        resnet_of(&device, depth, width),
        optimizer(),
    )?;
    let load = start.elapsed().as_secs_f64();
    drop(resumed);
    out.figures.push(Figure::new(
        NAME,
        format!("{label}: checkpoint size"),
        size,
        "MB",
    ));
    out.figures
        .push(Figure::new(NAME, format!("{label}: save"), save, "s"));
    out.figures.push(
        Figure::new(
            NAME,
            format!("{label}: save MB/s ÷ disk sequential write ({disk:.0} MB/s)"),
            size / save / disk,
            "ratio",
        )
        .target(Target::AtLeast(0.5)),
    );
    out.figures.push(Figure::new(
        NAME,
        format!("{label}: load and verify"),
        load,
        "s",
    ));
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// Mean step seconds of `steps` single-device steps of ResNet-18 (width `width`), with a
/// checkpoint every `every` steps when given.
fn mean_step(
    width: usize,
    steps: usize,
    every: Option<usize>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let device = Device::flex().autodiff();
    let loader = DataLoader::builder(Arc::new(data(BATCH * (steps + 1))))
        .batch_size(BATCH)
        .num_workers(1)
        .device(device.clone())
        .build();
    let mut builder = Trainer::builder(resnet_of(&device, 18, width), optimizer())
        .schedule(LrSchedule::constant(0.05))
        .train_loader(loader)
        .max_steps(steps)
        .progress(false)
        .log_epochs(false);
    let dir = scratch(&format!("slowdown-{}", every.unwrap_or(0)));
    if let Some(every) = every {
        builder = builder.checkpoint(Checkpointer::new(
            CheckpointStore::new(&dir, 2),
            every,
            RunIdentity::new("resnet18"),
        ));
    }
    let start = Instant::now();
    let (_, report) = builder.build()?.fit()?;
    let total = start.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&dir).ok();
    // The whole run over its steps: the last write is waited for at the end, and every
    // snapshot's copy counts.
    Ok(total / report.steps.len().max(1) as f64)
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let disk = disk_write_speed(&scratch("disk"), if args.quick { 64 } else { 256 })?;
    out.figures.push(Figure::new(
        NAME,
        "disk sequential write (synced)",
        disk,
        "MB/s",
    ));
    save_and_load(&mut out, 18, if args.quick { 16 } else { 64 }, disk)?;
    if !args.quick {
        save_and_load(&mut out, 50, 64, disk)?;
    }
    let (width, steps, every) = if args.quick { (8, 8, 4) } else { (32, 24, 4) };
    let plain = mean_step(width, steps, None)?;
    let saving = mean_step(width, steps, Some(every))?;
    out.figures.push(
        Figure::new(
            NAME,
            format!("resnet18 w{width}: step with a checkpoint every {every} ÷ without"),
            saving / plain,
            "ratio",
        )
        .target(Target::AtMost(1.05)),
    );
    Ok(out)
}
