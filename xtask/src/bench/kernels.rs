//! kiln's CPU convolution kernels layer by layer: each of ResNet-18's convolutions (CIFAR
//! stem, batch 32; 8 with `--quick`) on one thread, every pass by every algorithm that can
//! run it, and PyTorch's time for the same pass (`xtask/peer/conv_layers.py`, when torch is
//! installed). It shows whether `conv_path` picks the fastest algorithm (the chosen paths'
//! sum against the fastest paths' sum) and where kiln stands per pass against PyTorch.

use std::path::PathBuf;
use std::process::Command;

use kiln::kernels::{ConvGeometry, ConvPass, ConvPath, ConvProbe};

use super::Output;
use super::peer::{peer_available, peer_result};
use crate::BenchArgs;
use crate::measure::fastest_ms;
use crate::report::{Figure, Target};

const NAME: &str = "kernels";

const PASSES: [(ConvPass, &str); 3] = [
    (ConvPass::Forward, "forward"),
    (ConvPass::InputGradient, "input gradient"),
    (ConvPass::WeightGradient, "weight gradient"),
];

/// `(in channels, out channels, input size, kernel, stride, count in the network)`, as the
/// peer lists them.
fn resnet18_convolutions(w: usize) -> [(usize, usize, usize, usize, usize, usize); 11] {
    [
        (3, w, 32, 3, 1, 1),
        (w, w, 32, 3, 1, 4),
        (w, 2 * w, 32, 3, 2, 1),
        (2 * w, 2 * w, 16, 3, 1, 3),
        (w, 2 * w, 32, 1, 2, 1),
        (2 * w, 4 * w, 16, 3, 2, 1),
        (4 * w, 4 * w, 8, 3, 1, 3),
        (2 * w, 4 * w, 16, 1, 2, 1),
        (4 * w, 8 * w, 8, 3, 2, 1),
        (8 * w, 8 * w, 4, 3, 1, 3),
        (4 * w, 8 * w, 8, 1, 2, 1),
    ]
}

/// Per pass: the chosen paths' and the fastest paths' time over the network (each layer
/// times its count), in ms.
#[derive(Default)]
struct Totals {
    chosen: [f64; 3],
    fastest: [f64; 3],
}

fn measure(width: usize, batch: usize, repeat: usize) -> Result<Totals, String> {
    let mut totals = Totals::default();
    for (cin, cout, size, k, stride, count) in resnet18_convolutions(width) {
        let pad = k / 2;
        let geometry = ConvGeometry::new()
            .with_stride([stride, stride])
            .with_padding([(pad, pad), (pad, pad)]);
        let probe = ConvProbe::new([batch, cin, size, size], [cout, cin, k, k], geometry)
            .ok_or_else(|| format!("{cin}->{cout} {size}x{size} k{k}: no convolution"))?;
        let mut line = format!("{cin:>4}->{cout:<4} {size:>2}x{size:<2} k{k} s{stride} x{count}:");
        for (index, (pass, name)) in PASSES.into_iter().enumerate() {
            // The stem's input gradient is never needed (the images are not trained).
            if cin == 3 && pass == ConvPass::InputGradient {
                continue;
            }
            let chosen = probe.chosen(pass);
            let times: Vec<(ConvPath, f64)> = probe
                .paths(pass)
                .into_iter()
                .map(|path| (path, fastest_ms(repeat, || probe.run(pass, path))))
                .collect();
            let time_of = |p: ConvPath| times.iter().find(|(q, _)| *q == p).map(|(_, t)| *t);
            let chosen_ms = time_of(chosen).ok_or("the chosen path did not run")?;
            let fastest = times.iter().fold(f64::INFINITY, |m, (_, t)| m.min(*t));
            totals.chosen[index] += chosen_ms * count as f64;
            totals.fastest[index] += fastest * count as f64;
            let others: Vec<String> = times
                .iter()
                .filter(|(p, _)| *p != chosen)
                .map(|(p, t)| format!("{p:?} {t:.2}"))
                .collect();
            line += &format!(" | {name} {chosen:?} {chosen_ms:.2} ms");
            if !others.is_empty() {
                line += &format!(" ({})", others.join(", "));
            }
        }
        println!("{line}");
    }
    Ok(totals)
}

/// PyTorch's per-pass totals (ms) for the same layers, or why none.
fn peer_totals(width: usize, batch: usize, repeat: usize) -> Result<[f64; 3], String> {
    peer_available()?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peer/conv_layers.py");
    let output = Command::new("python3")
        .arg(script)
        .args(["--width", &width.to_string()])
        .args(["--batch", &batch.to_string()])
        .args(["--threads", "1"])
        .env("PEER_REPEAT", repeat.to_string())
        .output()
        .map_err(|err| format!("python3: {err}"))?;
    let (value, line) = peer_result(&output)?;
    let field = |name: &str| {
        value[name]
            .as_f64()
            .ok_or_else(|| format!("the PyTorch peer printed no {name}: {line}"))
    };
    Ok([
        field("forward_ms")?,
        field("input_gradient_ms")?,
        field("weight_gradient_ms")?,
    ])
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    // Width 16 is the README's model, 64 the peer table's large one.
    let (widths, batch, repeat): (&[usize], _, _) = if args.quick {
        (&[8], 8, 3)
    } else {
        (&[16, 64], 32, 15)
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let mut out = Output::default();
    for &width in widths {
        println!(
            "{NAME}: ResNet-18's convolutions, width {width}, batch {batch}, one thread, fastest of {repeat} (ms; the chosen path first, the others in brackets)"
        );
        let totals = pool.install(|| measure(width, batch, repeat))?;
        out.figures.extend(figures(&totals, width, batch, repeat));
    }
    Ok(out)
}

/// The per-pass totals, the choice against the fastest paths, and PyTorch's time against
/// kiln's for one width.
fn figures(totals: &Totals, width: usize, batch: usize, repeat: usize) -> Vec<Figure> {
    let mut figures = Vec::new();
    let chosen: f64 = totals.chosen.iter().sum();
    let fastest: f64 = totals.fastest.iter().sum();
    for (index, (_, name)) in PASSES.into_iter().enumerate() {
        figures.push(Figure::new(
            NAME,
            format!("{name}, all layers, w{width} b{batch}, 1 thread"),
            totals.chosen[index],
            "ms",
        ));
    }
    // Timing noise alone moves a path by a few percent: 10 % is a wrong choice.
    figures.push(
        Figure::new(
            NAME,
            format!("chosen paths / fastest paths, w{width} b{batch}"),
            chosen / fastest.max(1e-12),
            "x",
        )
        .target(Target::AtMost(1.10)),
    );
    match peer_totals(width, batch, repeat) {
        Ok(peer) => {
            let peer_sum: f64 = peer.iter().sum();
            for (index, (_, name)) in PASSES.into_iter().enumerate() {
                println!(
                    "{name}: kiln {:.1} ms, PyTorch {:.1} ms",
                    totals.chosen[index], peer[index]
                );
            }
            figures.push(
                Figure::new(
                    NAME,
                    format!("PyTorch time / kiln time, all passes, w{width} b{batch}, 1 thread"),
                    peer_sum / chosen.max(1e-12),
                    "x",
                )
                .target(Target::AtLeast(1.0)),
            );
        }
        Err(why) => println!("{NAME}: no PyTorch figures: {why}"),
    }
    figures
}
