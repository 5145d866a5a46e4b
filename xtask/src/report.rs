//! Figures, the table, results.json and comparison with an earlier run.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a figure should be.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub enum Target {
    /// At least this much.
    AtLeast(f64),
    /// At most this much.
    AtMost(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }

    fn describe(self) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {t}"),
            Target::AtMost(t) => format!("<= {t}"),
        }
    }
}

/// One measured number.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    pub bench: String,
    pub name: String,
    pub value: f64,
    pub unit: String,
    /// (max − min) / median over repetitions, when repeated.
    pub spread: Option<f64>,
    pub target: Option<Target>,
}

impl Figure {
    pub fn new(bench: &str, name: impl Into<String>, value: f64, unit: &str) -> Self {
        Self {
            bench: bench.into(),
            name: name.into(),
            value,
            unit: unit.into(),
            spread: None,
            target: None,
        }
    }

    pub fn spread(mut self, spread: f64) -> Self {
        self.spread = Some(spread);
        self
    }

    pub fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.bench, self.name)
    }
}

/// Everything one run wrote.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results {
    pub machine: Machine,
    pub quick: bool,
    pub figures: Vec<Figure>,
}

/// Where the figures were measured.
#[derive(Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub os: String,
    pub arch: String,
    pub backend: String,
    pub git_revision: String,
    pub timestamp_unix: u64,
}

impl Machine {
    pub fn detect(devices: &str) -> Self {
        let git = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output();
        let git_revision = git
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        Self {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            backend: if devices.starts_with("cpu") {
                "flex (CPU)".into()
            } else {
                devices.into()
            },
            git_revision,
            timestamp_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// The figures that miss their target, described.
pub fn missed_targets(figures: &[Figure]) -> Vec<String> {
    figures
        .iter()
        .filter_map(|f| {
            let target = f.target?;
            (!target.met(f.value)).then(|| {
                format!(
                    "{} = {:.3} (target {})",
                    f.key(),
                    f.value,
                    target.describe()
                )
            })
        })
        .collect()
}

/// Prints the aligned table.
pub fn print_table(figures: &[Figure]) {
    println!(
        "\n{:<12} {:<52} {:>12} {:<8} {:>8} {:>10} {:>4}",
        "bench", "figure", "value", "unit", "spread", "target", "met"
    );
    println!("{}", "-".repeat(114));
    for f in figures {
        let spread = f
            .spread
            .map(|s| format!("{:.1}%", 100.0 * s))
            .unwrap_or_default();
        let (target, met) = match f.target {
            Some(t) => (t.describe(), if t.met(f.value) { "yes" } else { "NO" }),
            None => (String::new(), ""),
        };
        println!(
            "{:<12} {:<52} {:>12.4} {:<8} {:>8} {:>10} {:>4}",
            f.bench, f.name, f.value, f.unit, spread, target, met
        );
    }
}

/// Prints every figure's ratio to the same figure in `old`.
pub fn print_comparison(
    figures: &[Figure],
    old_path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let old: Results = serde_json::from_str(&std::fs::read_to_string(old_path)?)?;
    println!(
        "\ncompared with {} (revision {}, {} cores, {}):",
        old_path.display(),
        old.machine.git_revision,
        old.machine.cores,
        old.machine.backend
    );
    println!(
        "{:<58} {:>12} {:>12} {:>8}",
        "figure", "now", "then", "ratio"
    );
    for f in figures {
        if let Some(then) = old.figures.iter().find(|o| o.key() == f.key()) {
            println!(
                "{:<58} {:>12.4} {:>12.4} {:>8.3}",
                f.key(),
                f.value,
                then.value,
                f.value / then.value
            );
        }
    }
    Ok(())
}
