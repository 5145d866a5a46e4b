//! kiln's GPT against PyTorch's, side by side: the `gpt` example's default model (4 blocks,
//! 4 heads, width 128, context 64, tied head), data (the Jargon File's bytes, the first 95 %
//! for training) and optimizer (AdamW with decay on the weight matrices, warm-up then cosine),
//! one replica on all cores, in the same run.
//!
//! The PyTorch side is `xtask/peer/gpt_peer.py` (nanoGPT's shape, PyTorch's fused causal
//! attention). It runs when `python3` can `import torch`; otherwise, or when a PyTorch run
//! fails, the benchmark says so and reports kiln's figures alone (never a failure).
//!
//! Figures: tokens/s of each (median step after the warm-up), their ratio, the mean training
//! loss of the last tenth of the steps and the held-out loss at the end, each side; the loss
//! curves go into `gpt_loss.svg`. The two sides draw their windows with their own generators
//! (same distribution, not the same batches), so the curves are compared, not equal.

use std::path::PathBuf;
use std::process::Command;

use kiln::data::{TextCorpus, TextWindows};
use kiln::ddp::{DataParallel, DdpConfig};
use kiln::gpt::GptConfig;
use kiln::kernels::FusedAdamWConfig;
use kiln::train::{LanguageModeling, LrSchedule, Trainer};

use super::throughput::cores;
use super::workload::devices;
use super::{Output, Plot};
use crate::BenchArgs;
use crate::measure::stats;
use crate::report::{Figure, Target};
use crate::svg::Series;

const NAME: &str = "gpt";

/// The `gpt` example's defaults (the memory bench's too).
pub(super) const LAYERS: usize = 4;
pub(super) const HEADS: usize = 4;
pub(super) const WIDTH: usize = 128;
pub(super) const CONTEXT: usize = 64;
pub(super) const BATCH: usize = 32;
const LR: f64 = 2e-3;
pub(super) const WEIGHT_DECAY: f32 = 0.1;
pub(super) const SEED: u64 = 1;

/// Steps (left out of the speed, in all): enough for the loss curves to say something in a
/// full run.
fn steps(quick: bool) -> (usize, usize) {
    if quick { (3, 12) } else { (5, 200) }
}

/// One side's run.
struct Run {
    tokens_per_sec: f64,
    spread: Option<f64>,
    losses: Vec<f64>,
    held_out_loss: f64,
}

impl Run {
    /// The mean training loss over the last tenth of the steps (at least one).
    fn late_loss(&self) -> f64 {
        let tail = (self.losses.len() / 10).max(1);
        let last = &self.losses[self.losses.len() - tail..];
        last.iter().sum::<f64>() / last.len() as f64
    }
}

/// kiln: one replica with `threads` compute threads trains `steps` steps of the example's
/// model, then evaluates on the held-out text.
fn kiln_run(
    spec: &str,
    threads: usize,
    (warmup, total): (usize, usize),
) -> Result<Run, Box<dyn std::error::Error>> {
    let device = devices(spec)?.remove(0);
    let (train, held_out) = TextCorpus::jargon_file().split(0.05)?;
    let config = GptConfig::new(256, CONTEXT, LAYERS, HEADS, WIDTH);
    let schedule = LrSchedule::constant(LR)
        .warmup(50.min(total / 4))
        .cosine(total, LR / 10.0);
    let ddp = DdpConfig {
        threads_per_replica: Some(threads),
        ..DdpConfig::default()
    };
    let mut outcomes = DataParallel::new(vec![device]).config(ddp).run(|replica| {
        let device = replica.train_device();
        let model = kiln::core::init_on_host(&device, SEED, |d| config.init(d));
        let optimizer = kiln::gpt::adamw(&FusedAdamWConfig::new().with_weight_decay(WEIGHT_DECAY));
        let windows = TextWindows::builder(train.clone())
            .context(CONTEXT)
            .batch_size(BATCH)
            .seed(SEED)
            .device(device.clone())
            .build()?;
        let held_out = TextWindows::builder(held_out.clone())
            .context(CONTEXT)
            .batch_size(64)
            .sequential()
            .device(replica.device().clone())
            .build()?;
        let step = replica.overlapped_step_with(LanguageModeling);
        let (_, report) = Trainer::with_objective(model, optimizer, LanguageModeling)
            .gradient_step(step)
            .schedule(schedule)
            .train_loader(windows)
            .valid_loader(held_out)
            .max_steps(total)
            .progress(false)
            .log_epochs(false)
            .build()?
            .fit()?;
        Ok(report)
    })?;
    let report = outcomes.swap_remove(0);
    let step = stats(
        report.steps[warmup.min(report.steps.len() - 1)..]
            .iter()
            .map(|s| BATCH as f64 / s.images_per_sec)
            .collect(),
    );
    let held_out_loss = report
        .epochs
        .last()
        .and_then(|epoch| epoch.valid_loss)
        .ok_or("kiln's run reported no held-out loss")?;
    Ok(Run {
        tokens_per_sec: (BATCH * CONTEXT) as f64 / step.median,
        spread: Some(step.spread),
        losses: report.steps.iter().map(|s| f64::from(s.loss)).collect(),
        held_out_loss: f64::from(held_out_loss),
    })
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peer/gpt_peer.py")
}

/// PyTorch: the same model, data and optimizer with `threads` threads.
fn peer_run(threads: usize, (warmup, total): (usize, usize)) -> Result<Run, String> {
    let number = |n: usize| n.to_string();
    let output = Command::new("python3")
        .arg(script())
        .args(["--layers", &number(LAYERS), "--heads", &number(HEADS)])
        .args(["--width", &number(WIDTH), "--context", &number(CONTEXT)])
        .args(["--batch", &number(BATCH), "--threads", &number(threads)])
        .args(["--steps", &number(total), "--warmup", &number(warmup)])
        .args(["--lr", &LR.to_string(), "--seed", &SEED.to_string()])
        .args(["--weight-decay", &WEIGHT_DECAY.to_string()])
        .output()
        .map_err(|err| format!("python3 not found ({err})"))?;
    let (value, line) = super::peer::peer_result(&output)?;
    let field = |name: &str| {
        value[name]
            .as_f64()
            .ok_or_else(|| format!("the PyTorch peer's result lacks {name}: {line}"))
    };
    let losses = value["losses"]
        .as_array()
        .map(|losses| {
            losses
                .iter()
                .filter_map(serde_json::Value::as_f64)
                .collect()
        })
        .ok_or_else(|| format!("the PyTorch peer's result lacks losses: {line}"))?;
    Ok(Run {
        tokens_per_sec: field("tokens_per_sec")?,
        spread: None,
        losses,
        held_out_loss: field("held_out_loss")?,
    })
}

/// The figures of one side.
fn side_figures(out: &mut Output, side: &str, label: &str, run: &Run) {
    let mut speed = Figure::new(
        NAME,
        format!("{label}: {side} tokens/s"),
        run.tokens_per_sec,
        "tokens/s",
    );
    if let Some(spread) = run.spread {
        speed = speed.spread(spread);
    }
    out.figures.push(speed);
    out.figures.push(Figure::new(
        NAME,
        format!("{label}: {side} training loss, last tenth of the steps"),
        run.late_loss(),
        "nats/byte",
    ));
    out.figures.push(Figure::new(
        NAME,
        format!("{label}: {side} held-out loss"),
        run.held_out_loss,
        "nats/byte",
    ));
}

fn curve(name: &str, run: &Run) -> Series {
    Series {
        name: name.into(),
        points: run
            .losses
            .iter()
            .enumerate()
            .map(|(step, &loss)| ((step + 1) as f64, loss))
            .collect(),
    }
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let threads = cores();
    let steps = steps(args.quick);
    let label =
        format!("{LAYERS} blocks w{WIDTH} ctx{CONTEXT} batch {BATCH}, 1 x {threads} thread(s)");
    let kiln = kiln_run(&args.devices, threads, steps)?;
    side_figures(&mut out, "kiln", &label, &kiln);
    let mut series = vec![curve("kiln", &kiln)];
    // The peer is optional: a failed PyTorch run is reported, never a failed bench.
    match super::peer::peer_available().and_then(|_| peer_run(threads, steps)) {
        Ok(torch) => {
            side_figures(&mut out, "PyTorch", &label, &torch);
            out.figures.push(
                Figure::new(
                    NAME,
                    format!("{label}: kiln / PyTorch tokens/s"),
                    kiln.tokens_per_sec / torch.tokens_per_sec,
                    "ratio",
                )
                .target(Target::AtLeast(1.0)),
            );
            series.push(curve("PyTorch", &torch));
        }
        Err(why) => println!("gpt: the PyTorch peer skipped: {why}"),
    }
    let memory = super::gpt_memory::run(args)?;
    out.figures.extend(memory.figures);
    out.plots.push(Plot {
        file: "gpt_loss",
        title: "GPT training loss per step, kiln and PyTorch (same model, data, optimizer)",
        x_label: "step",
        y_label: "training loss (nats/byte)",
        log_x: false,
        series,
    });
    Ok(out)
}
