//! All-reduce bus bandwidth against single-thread memcpy bandwidth.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use kiln::comm::{InProcessGroup, ReduceBuffer, ReduceOp};

use super::{Output, Plot};
use crate::BenchArgs;
use crate::measure::{stats, time};
use crate::report::{Figure, Target};
use crate::svg::Series;

const NAME: &str = "collectives";

/// Bytes per second of a single-threaded copy of `bytes`.
fn memcpy_bandwidth(bytes: usize, reps: usize) -> f64 {
    let n = bytes / 4;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let s = time(2, reps, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
    });
    bytes as f64 / s.median
}

/// How the benchmark hands data to the all-reduce.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    /// `all_reduce(&mut [f32])`: stages the slice and copies the result back.
    Slice,
    /// `all_reduce_buffer(&mut ReduceBuffer)`: zero-copy.
    Buffer,
}

/// Seconds per all-reduce of `bytes` over `world` in-process ranks (slowest rank).
fn all_reduce_seconds(bytes: usize, world: usize, reps: usize, api: Api) -> Vec<f64> {
    let n = bytes / 4;
    let start = Arc::new(Barrier::new(world));
    let comms = InProcessGroup::new(world).build();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|comm| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let mut data = vec![comm.rank() as f32; n];
                let mut buffer = ReduceBuffer::new(n, world);
                buffer.copy_from(&data);
                let mut samples = Vec::with_capacity(reps);
                for rep in 0..reps + 2 {
                    start.wait();
                    let t = Instant::now();
                    match api {
                        Api::Slice => comm.all_reduce(&mut data, ReduceOp::Sum),
                        Api::Buffer => comm.all_reduce_buffer(&mut buffer, ReduceOp::Sum),
                    }
                    .expect("all-reduce");
                    if rep >= 2 {
                        samples.push(t.elapsed().as_secs_f64());
                    }
                }
                samples
            })
        })
        .collect();
    let mut per_rank: Vec<Vec<f64>> = handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect();
    // An operation lasts until its slowest rank finishes.
    let mut worst = per_rank.swap_remove(0);
    for other in per_rank {
        worst.iter_mut().zip(other).for_each(|(w, o)| *w = w.max(o));
    }
    worst
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let sizes_mb: &[usize] = if args.quick {
        &[1, 4]
    } else {
        &[1, 4, 25, 100]
    };
    let reps = if args.quick { 5 } else { 10 };
    let mut out = Output::default();
    let mut lines: Vec<Series> = Vec::new();
    for (api, label) in [(Api::Buffer, "buffer"), (Api::Slice, "slice")] {
        for world in [2, 4] {
            let mut line = Series {
                name: format!("{label}, {world} ranks"),
                points: Vec::new(),
            };
            for &mb in sizes_mb {
                let bytes = mb << 20;
                let memcpy = memcpy_bandwidth(bytes, reps);
                let s = stats(all_reduce_seconds(bytes, world, reps, api));
                let bus = 2.0 * (world as f64 - 1.0) / world as f64 * bytes as f64 / s.median;
                let ratio = bus / memcpy;
                let name = format!("{label} {world} ranks {mb} MB");
                out.figures.push(
                    Figure::new(NAME, format!("{name} busbw"), bus / 1e9, "GB/s").spread(s.spread),
                );
                let figure =
                    Figure::new(NAME, format!("{name} / memcpy"), ratio, "ratio").spread(s.spread);
                // The target is for the zero-copy path; the slice API pays two staging copies.
                out.figures.push(if api == Api::Buffer {
                    figure.target(Target::AtLeast(0.8))
                } else {
                    figure
                });
                line.points.push((mb as f64, ratio));
            }
            lines.push(line);
        }
    }
    match mpi_figures(sizes_mb, reps, args.quick) {
        Ok((figures, mpi_lines)) => {
            out.figures.extend(figures);
            lines.extend(mpi_lines);
        }
        Err(why) => eprintln!("collectives: MPI figures skipped: {why}"),
    }
    out.plots.push(Plot {
        file: "allreduce_bandwidth",
        title: "In-process all-reduce bus bandwidth / memcpy bandwidth",
        x_label: "message size (MB)",
        y_label: "busbw / memcpy",
        log_x: true,
        series: lines,
    });
    Ok(out)
}

/// Builds the MPI timing program and runs it under `mpirun` at 2 and 4 ranks, when Open MPI
/// is installed. Each figure is divided by memcpy bandwidth measured here, in the same run.
///
/// A `quick` run (CI's smoke run) builds it in the dev profile (dependencies optimised
/// there too) with the whole workspace's MPI features, the build CI's MPI steps use: one
/// build of Burn instead of a release one of its own.
fn mpi_figures(
    sizes_mb: &[usize],
    reps: usize,
    quick: bool,
) -> Result<(Vec<Figure>, Vec<Series>), String> {
    use std::process::Command;
    let found = Command::new("mpirun")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        return Err("mpirun not found (install Open MPI)".into());
    }
    let (build_args, profile): (&[&str], _) = if quick {
        (
            &["--workspace", "--features", "kiln/mpi", "--examples"],
            "debug",
        )
    } else {
        (
            &[
                "--release",
                "-p",
                "kiln-comm",
                "--features",
                "mpi",
                "--example",
                "mpi_bandwidth",
            ],
            "release",
        )
    };
    let build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .arg("build")
        .args(build_args)
        .status()
        .map_err(|e| e.to_string())?;
    if !build.success() {
        return Err("could not build the MPI timing program".into());
    }
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let program = std::path::Path::new(&target)
        .join(profile)
        .join("examples/mpi_bandwidth");
    let (mut figures, mut lines) = (Vec::new(), Vec::new());
    for world in [2, 4] {
        let output = Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                &world.to_string(),
            ])
            .arg(&program)
            .arg(reps.to_string())
            .args(sizes_mb.iter().map(|s| s.to_string()))
            .output()
            .map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!(
                "mpirun failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let mut line = Series {
            name: format!("MPI, {world} ranks"),
            points: Vec::new(),
        };
        for row in String::from_utf8_lossy(&output.stdout).lines() {
            let cols: Vec<f64> = row
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect();
            let [mb, median, min, max] = cols[..] else {
                continue;
            };
            let bytes = (mb as usize) << 20;
            let memcpy = memcpy_bandwidth(bytes, reps);
            let bus = 2.0 * (world as f64 - 1.0) / world as f64 * bytes as f64 / median;
            let name = format!("MPI {world} ranks {mb} MB");
            let spread = (max - min) / median;
            figures
                .push(Figure::new(NAME, format!("{name} busbw"), bus / 1e9, "GB/s").spread(spread));
            figures.push(
                Figure::new(NAME, format!("{name} / memcpy"), bus / memcpy, "ratio").spread(spread),
            );
            line.points.push((mb, bus / memcpy));
        }
        lines.push(line);
    }
    Ok((figures, lines))
}
