//! The benchmark suite.
//!
//! Every benchmark measures its figure and the baseline it is judged against in the same run
//! (machines here are noisy), repeats, and reports the median and spread.

mod amp;
mod checkpoint;
mod collectives;
mod ddp;
mod gpt;
mod gpt_memory;
mod kernel_parts;
mod kernels;
mod loader;
mod optimizer;
mod overhead;
mod peer;
mod pipeline;
mod planner;
mod profile;
mod threads;
mod throughput;
mod workload;

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

use crate::BenchArgs;
use crate::report::{Figure, Machine, Results, missed_targets, print_comparison, print_table};
use crate::svg::Series;

/// A chart to write: file stem, title, axes, log-x, lines.
pub struct Plot {
    pub file: &'static str,
    pub title: &'static str,
    pub x_label: &'static str,
    pub y_label: &'static str,
    pub log_x: bool,
    pub series: Vec<Series>,
}

/// What a benchmark returns.
#[derive(Default)]
pub struct Output {
    pub figures: Vec<Figure>,
    pub plots: Vec<Plot>,
}

type Bench = fn(&BenchArgs) -> Result<Output, Box<dyn std::error::Error>>;

const SUITE: [(&str, Bench); 15] = [
    ("collectives", collectives::run),
    ("overhead", overhead::run),
    ("ddp", ddp::run),
    ("loader", loader::run),
    ("amp", amp::run),
    ("threads", threads::run),
    ("profile", profile::run),
    ("optimizer", optimizer::run),
    ("kernels", kernels::run),
    ("kernel-parts", kernel_parts::run),
    ("peer", peer::run),
    ("pipeline", pipeline::run),
    ("planner", planner::run),
    ("checkpoint", checkpoint::run),
    ("gpt", gpt::run),
];

pub fn run(args: &BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    for name in &args.only {
        if !SUITE.iter().any(|(n, _)| n == name) {
            return Err(format!(
                "unknown benchmark `{name}`; the suite has {:?}",
                SUITE.map(|(n, _)| n)
            )
            .into());
        }
    }
    let selected: Vec<_> = SUITE
        .iter()
        .filter(|(n, _)| args.only.is_empty() || args.only.iter().any(|o| o == n))
        .collect();
    let bar = ProgressBar::new(selected.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("bench [{bar:20}] {pos}/{len} {msg} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut figures = Vec::new();
    let mut plots = Vec::new();
    for (name, bench) in selected {
        bar.set_message(*name);
        let output = bar.suspend(|| bench(args))?;
        figures.extend(output.figures);
        plots.extend(output.plots);
        bar.inc(1);
    }
    bar.finish_and_clear();

    print_table(&figures);
    std::fs::create_dir_all(&args.out)?;
    let results = Results {
        machine: Machine::detect(&args.devices),
        quick: args.quick,
        figures,
    };
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    for plot in &plots {
        let svg = crate::svg::line_chart(
            plot.title,
            plot.x_label,
            plot.y_label,
            plot.log_x,
            &plot.series,
        );
        std::fs::write(args.out.join(format!("{}.svg", plot.file)), svg)?;
    }
    println!(
        "\nwrote {} and {} plot(s)",
        Path::new(&args.out).join("results.json").display(),
        plots.len()
    );
    if let Some(old) = &args.compare {
        print_comparison(&results.figures, old)?;
    }
    let missed = missed_targets(&results.figures);
    if args.check && !missed.is_empty() {
        return Err(format!(
            "{} figure(s) missed their target: {}",
            missed.len(),
            missed.join("; ")
        )
        .into());
    }
    Ok(())
}
