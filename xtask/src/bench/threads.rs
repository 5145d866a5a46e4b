//! Thread scaling: images/s against threads per replica, for one and two replicas.
//!
//! Each replica computes in its own pool (`DdpConfig::threads_per_replica`); this checks that
//! more threads never make a step slower and how close to linear the gain is. The thread counts
//! of a replica count are measured in [`ROUNDS`] interleaved rounds and each reports its best
//! round, so that a busy moment of a shared machine does not land on one count alone.

use super::throughput::{Setting, cores, images_per_sec};
use super::workload::{devices, steps};
use super::{Output, Plot};
use crate::BenchArgs;
use crate::report::{Figure, Target};
use crate::svg::Series;

const NAME: &str = "threads";

/// Interleaved rounds over a replica count's thread counts (`--quick`: one).
const ROUNDS: usize = 3;

/// 1, 2, 4, ... up to `limit`, and `limit` itself.
fn thread_counts(limit: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = std::iter::successors(Some(1), |n| Some(n * 2))
        .take_while(|n| *n < limit)
        .collect();
    counts.push(limit.max(1));
    counts
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let devices = devices(&args.devices)?;
    let (warmup, measured) = steps(args.quick);
    let rounds = if args.quick { 1 } else { ROUNDS };
    let width = 16;
    let mut series = Vec::new();
    for replicas in [1, 2] {
        let mut line = Series {
            name: format!("{replicas} replica(s), ResNet-18 w{width}"),
            points: Vec::new(),
        };
        let counts = thread_counts((cores() / replicas).max(1));
        // Per thread count: the best round's images/s and its step spread.
        let mut best = vec![(0.0f64, 0.0f64); counts.len()];
        for _ in 0..rounds {
            for (slot, &threads) in best.iter_mut().zip(&counts) {
                let setting = Setting {
                    width,
                    replicas,
                    threads,
                };
                let (images, stats) = images_per_sec(&devices, setting, warmup, measured)?;
                if images > slot.0 {
                    *slot = (images, stats.spread);
                }
            }
        }
        let mut one_thread = None;
        let mut previous: Option<f64> = None;
        for (&threads, &(images, spread)) in counts.iter().zip(&best) {
            let base = *one_thread.get_or_insert(images);
            out.figures.push(
                Figure::new(
                    NAME,
                    format!("{replicas} replica(s) x {threads} thread(s): images/s"),
                    images,
                    "img/s",
                )
                .spread(spread),
            );
            if threads > 1 {
                // Target from the speed issue: one replica on 2 cores >= 1.7x one on 1 core.
                let mut figure = Figure::new(
                    NAME,
                    format!("{replicas} replica(s) x {threads} threads / x 1 thread"),
                    images / base,
                    "ratio",
                );
                if threads == 2 {
                    figure = figure.target(Target::AtLeast(1.7));
                }
                out.figures.push(figure);
            }
            if let Some(before) = previous {
                // More threads never slower (5 % for noise).
                out.figures.push(
                    Figure::new(
                        NAME,
                        format!("{replicas} replica(s): {threads} threads / fewer"),
                        images / before,
                        "ratio",
                    )
                    .target(Target::AtLeast(0.95)),
                );
            }
            previous = Some(images);
            line.points.push((threads as f64, images));
        }
        series.push(line);
    }
    out.plots.push(Plot {
        file: "thread_scaling",
        title: "Images/s against threads per replica (ResNet-18 w16, batch 32/replica)",
        x_label: "threads per replica",
        y_label: "images/s (all replicas)",
        log_x: false,
        series,
    });
    Ok(out)
}
