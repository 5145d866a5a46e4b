//! kiln against PyTorch, side by side: the same model, batch and optimizer, in the same run.
//!
//! The PyTorch side is `xtask/peer/resnet_peer.py` (DistributedDataParallel over gloo, one
//! process per replica, `torch.set_num_threads` per rank). It runs when `python3` can
//! `import torch`; otherwise, or when a PyTorch run fails, the benchmark says so and reports
//! nothing for it (never a failure).
//!
//! Each setting runs in [`ROUNDS`] rounds, kiln then PyTorch in each, and each side reports
//! its best round (every round a median over its measured steps). On a shared machine the
//! load changes within minutes: one round each moved a ratio by ±0.2 between runs; the best
//! of interleaved rounds gives both sides the same chance at a quiet moment. With two rounds
//! single settings still moved by 20–40 % between runs (a step's spread reached 30–50 %
//! within a round), so three.

use std::path::PathBuf;
use std::process::Command;

use super::Output;
use super::throughput::{Setting, cores, images_per_sec};
use super::workload::{BATCH, devices, steps};
use crate::BenchArgs;
use crate::report::{Figure, Target};

const NAME: &str = "peer";

/// Rounds per setting (kiln, then PyTorch, in each): full runs; `--quick` runs one.
const ROUNDS: usize = 3;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peer/resnet_peer.py")
}

/// Whether the peer can run, or why not.
pub(super) fn peer_available() -> Result<String, String> {
    let output = Command::new("python3")
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .map_err(|err| format!("python3 not found ({err})"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err("python3 cannot import torch (install it with `pip install torch`)".into())
    }
}

/// PyTorch's images/s over all replicas for `setting`.
fn peer_images_per_sec(
    setting: Setting,
    warmup: usize,
    measured: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let output = Command::new("python3")
        .arg(script())
        .args(["--width", &setting.width.to_string()])
        .args(["--replicas", &setting.replicas.to_string()])
        .args(["--threads", &setting.threads.to_string()])
        .args(["--batch", &BATCH.to_string()])
        .args(["--warmup", &warmup.to_string()])
        .args(["--steps", &measured.to_string()])
        .output()?;
    let (value, line) = peer_result(&output)?;
    value["images_per_sec"]
        .as_f64()
        .ok_or_else(|| format!("the PyTorch peer failed: {line}").into())
}

/// A peer's result: the JSON object on its last line of output, and that line; or why none,
/// with everything it printed.
pub(super) fn peer_result(
    output: &std::process::Output,
) -> Result<(serde_json::Value, String), String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default().to_string();
    let value = serde_json::from_str(&line).map_err(|err| {
        format!(
            "the PyTorch peer printed no result ({err}): {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    Ok((value, line))
}

/// Widths, replicas and threads per replica: 1 thread per replica and all cores, deduplicated.
fn settings(quick: bool) -> Vec<Setting> {
    let widths: &[usize] = if quick { &[16] } else { &[16, 64] };
    let mut all = Vec::new();
    for &width in widths {
        for replicas in [1, 2] {
            let all_cores = (cores() / replicas).max(1);
            for threads in [1, all_cores] {
                let setting = Setting {
                    width,
                    replicas,
                    threads,
                };
                if !all.iter().any(|s: &Setting| {
                    (s.width, s.replicas, s.threads) == (width, replicas, threads)
                }) {
                    all.push(setting);
                }
            }
        }
    }
    all
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let torch = match peer_available() {
        Ok(version) => version,
        Err(why) => {
            println!("peer: skipped, {why}");
            return Ok(out);
        }
    };
    println!("peer: PyTorch {torch}");
    let devices = devices(&args.devices)?;
    let (warmup, measured) = steps(args.quick);
    let rounds = if args.quick { 1 } else { ROUNDS };
    'settings: for setting in settings(args.quick) {
        let (mut kiln, mut torch) = (0.0f64, 0.0f64);
        let mut spread = 0.0;
        for _ in 0..rounds {
            let (images, stats) = images_per_sec(&devices, setting, warmup, measured)?;
            if images > kiln {
                (kiln, spread) = (images, stats.spread);
            }
            // The peer is optional: a failed PyTorch run is reported, never a failed bench.
            match peer_images_per_sec(setting, warmup, measured) {
                Ok(images) => torch = torch.max(images),
                Err(err) => {
                    println!("peer: skipped {setting:?}: {err}");
                    continue 'settings;
                }
            }
        }
        let label = format!(
            "w{} {} replica(s) x {} thread(s)",
            setting.width, setting.replicas, setting.threads
        );
        out.figures.push(
            Figure::new(NAME, format!("{label}: kiln images/s"), kiln, "img/s").spread(spread),
        );
        out.figures.push(Figure::new(
            NAME,
            format!("{label}: PyTorch images/s"),
            torch,
            "img/s",
        ));
        out.figures.push(
            Figure::new(
                NAME,
                format!("{label}: kiln / PyTorch"),
                kiln / torch,
                "ratio",
            )
            .target(Target::AtLeast(1.0)),
        );
    }
    Ok(out)
}
