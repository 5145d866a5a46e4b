//! Pipeline schedules at P = 2 on a model whose stages are equal (a stack of identical
//! convolution blocks): the measured bubble against the formula, the step time against the
//! time the schedule predicts from the measured per-stage compute, and the activations
//! 1F1B keeps in flight against GPipe's.

use std::time::Duration;

use burn::module::{Module, ModuleVisitor};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use kiln::core::{ImageClassifier, SegmentId, Segmented, init_module};
use kiln::data::{DataLoader, SyntheticImages};
use kiln::pipeline::schedule::{ScheduleKind, bubble_formula};
use kiln::pipeline::{Pipeline, PipelineConfig, PipelineReport};
use kiln::train::LrSchedule;

use super::workload::optimizer;
use super::{Output, Plot};
use crate::BenchArgs;
use crate::report::{Figure, Target};
use crate::svg::Series;

const NAME: &str = "pipeline";
const STAGES: usize = 2;
const BATCH: usize = 64;
const WIDTH: usize = 32;
const BLOCKS: usize = 8;
const SIZE: usize = 16;

/// A stem, `BLOCKS` identical 3×3 convolution blocks at one resolution, a linear head: with
/// the stem on the first stage and the head on the last, the two stages do the same work.
#[derive(Module, Debug)]
struct UniformNet {
    stem: Conv2d,
    blocks: Vec<Conv2d>,
    head: Linear,
}

fn conv(channels: [usize; 2], device: &Device) -> Conv2d {
    Conv2dConfig::new(channels, [3, 3])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .init(device)
}

fn build(device: &Device) -> UniformNet {
    init_module(device, 11, || UniformNet {
        stem: conv([3, WIDTH], device),
        blocks: (0..BLOCKS).map(|_| conv([WIDTH, WIDTH], device)).collect(),
        head: LinearConfig::new(WIDTH, 10).init(device),
    })
}

impl Segmented for UniformNet {
    type Input = Tensor<4>;
    type Hidden = Tensor<4>;
    type Output = Tensor<2>;

    fn num_middle_segments(&self) -> usize {
        self.blocks.len()
    }

    fn forward_input(&self, input: Tensor<4>) -> Tensor<4> {
        relu(kiln::kernels::conv2d(&self.stem, input))
    }

    fn forward_middle(&self, index: usize, hidden: Tensor<4>) -> Tensor<4> {
        relu(kiln::kernels::conv2d(&self.blocks[index], hidden))
    }

    fn forward_output(&self, hidden: Tensor<4>) -> Tensor<2> {
        let [batch, channels, _, _] = hidden.dims();
        let pooled = hidden.mean_dim(3).mean_dim(2).reshape([batch, channels]);
        self.head.forward(pooled)
    }

    fn visit_segment<V: ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V) {
        match segment {
            SegmentId::Input => self.stem.visit(visitor),
            SegmentId::Middle(index) => self.blocks[index].visit(visitor),
            SegmentId::Output => self.head.visit(visitor),
        }
    }
}

impl ImageClassifier for UniformNet {
    fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
        let mut hidden = self.forward_input(images);
        for index in 0..self.blocks.len() {
            hidden = self.forward_middle(index, hidden);
        }
        self.forward_output(hidden)
    }
}

/// One pipeline run: `steps` steps of `BATCH` samples cut into `micro_batches`.
fn run_once(
    kind: ScheduleKind,
    micro_batches: usize,
    steps: usize,
) -> Result<PipelineReport, Box<dyn std::error::Error>> {
    let mut loader = DataLoader::builder(SyntheticImages::new(BATCH * 4, 10, 1, [3, SIZE, SIZE]))
        .batch_size(BATCH)
        .device(Device::flex().autodiff())
        .build();
    let config = PipelineConfig {
        schedule: kind,
        micro_batches,
        // Blocks split evenly; the stem and the head are small next to a block.
        split: Some(split(kind)),
        threads_per_stage: Some((super::throughput::cores() / STAGES).max(1)),
        timeout: Duration::from_secs(120),
        ..PipelineConfig::default()
    };
    Ok(Pipeline::new(vec![Device::flex(); STAGES])
        .config(config)
        .train(
            build,
            optimizer,
            &LrSchedule::constant(0.01),
            &mut loader,
            steps,
        )?)
}

/// Segments per virtual stage: the stem with the first blocks, the head with the last.
fn split(kind: ScheduleKind) -> Vec<usize> {
    let parts = STAGES * kind.chunks();
    let mut split = vec![BLOCKS / parts; parts];
    split[0] += 1;
    split[parts - 1] += 1;
    split
}

pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let mut out = Output::default();
    let steps = if args.quick { 3 } else { 8 };
    let kinds = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved { virtual_stages: 2 },
    ];
    let micro_batch_counts: &[usize] = if args.quick { &[2, 8] } else { &[2, 4, 8, 16] };
    let mut series = Vec::new();
    let mut in_flight_at_8 = Vec::new();
    for kind in kinds {
        let mut measured = Series {
            name: format!("{kind} measured"),
            points: Vec::new(),
        };
        let mut formula = Series {
            name: format!("{kind} formula"),
            points: Vec::new(),
        };
        for &m in micro_batch_counts {
            let baseline = crate::live_bytes();
            crate::reset_peak();
            let report = run_once(kind, m, steps)?;
            let peak = crate::peak_bytes().saturating_sub(baseline);
            let expected = bubble_formula(kind, STAGES, m)?;
            let bubble = report.bubble_fraction();
            measured.points.push((m as f64, bubble));
            formula.points.push((m as f64, expected));
            let label = |what: &str| format!("{kind} M={m}: {what}");
            out.figures
                .push(Figure::new(NAME, label("bubble"), bubble, "fraction"));
            out.figures.push(
                Figure::new(
                    NAME,
                    label("bubble − formula"),
                    (bubble - expected).abs(),
                    "fraction",
                )
                .target(Target::AtMost(0.05)),
            );
            out.figures.push(
                Figure::new(
                    NAME,
                    label("step time / schedule's prediction"),
                    report.step_time.as_secs_f64()
                        / report.predicted_step_time.as_secs_f64().max(1e-12),
                    "ratio",
                )
                .target(Target::AtMost(1.10)),
            );
            let busy: Vec<String> = report
                .stages
                .iter()
                .map(|s| format!("{:.0}%", s.busy_fraction * 100.0))
                .collect();
            out.figures.push(Figure::new(
                NAME,
                label(&format!("step time (stages busy {})", busy.join(", "))),
                report.step_time.as_secs_f64() * 1e3,
                "ms",
            ));
            if m == 8 && kind != kinds[2] {
                let held: usize = report.stages.iter().map(|s| s.peak_in_flight).sum();
                in_flight_at_8.push((kind, held, peak));
            }
        }
        series.push(measured);
        series.push(formula);
    }
    if let [(_, gpipe_held, gpipe_peak), (_, ofob_held, ofob_peak)] = in_flight_at_8[..] {
        // Equal stages keep equal activations per micro-batch, so the ratio of micro-batches
        // held at the peak is the ratio of activation memory.
        out.figures.push(
            Figure::new(
                NAME,
                "M=8: activations held at peak, 1F1B / GPipe (micro-batches over all stages)",
                ofob_held as f64 / gpipe_held.max(1) as f64,
                "ratio",
            )
            .target(Target::AtMost(1.2 * STAGES as f64 / 8.0)),
        );
        out.figures.push(Figure::new(
            NAME,
            "M=8: process peak memory above the start (parameters, optimizer state included), 1F1B / GPipe",
            ofob_peak as f64 / gpipe_peak.max(1) as f64,
            "ratio",
        ));
    }
    out.plots.push(Plot {
        file: "pipeline_bubble",
        title: "Pipeline bubble against micro-batches (P = 2, equal stages)",
        x_label: "micro-batches M",
        y_label: "idle fraction of the step",
        log_x: true,
        series,
    });
    Ok(out)
}
