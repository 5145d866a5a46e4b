//! The example's options: parsed and range-checked by clap, and refused in combinations that
//! would otherwise be silently ignored.

use clap::{Parser, ValueEnum};
use kiln::amp::Precision;

/// Counts that must be at least one (batch sizes, periods, widths, ...).
fn positive() -> impl clap::builder::TypedValueParser<Value = usize> {
    |text: &str| match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(count) => Ok(count),
        Err(err) => Err(format!("not a count: {err}")),
    }
}

/// A positive, finite gradient norm.
fn positive_norm(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(norm) if norm.is_finite() && norm > 0.0 => Ok(norm),
        Ok(norm) => Err(format!("must be positive and finite, not {norm}")),
        Err(err) => Err(format!("not a number: {err}")),
    }
}

/// Gradient element type on the wire.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressionArg {
    F32,
    F16,
    Bf16,
}

/// Where gradients wait for their all-reduce.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradientPathArg {
    Auto,
    Host,
    Device,
}

/// Compute precision.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmpArg {
    F32,
    F16,
    Bf16,
}

impl AmpArg {
    /// The precision this option names.
    pub fn precision(self) -> Precision {
        match self {
            AmpArg::F32 => Precision::F32,
            AmpArg::F16 => Precision::F16,
            AmpArg::Bf16 => Precision::Bf16,
        }
    }
}

/// How replicas communicate.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommArg {
    Local,
    Mpi,
}

/// Train a ResNet with kiln.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// ResNet depth: 18, 34, 50, 101 or 152.
    #[arg(long, default_value_t = 18)]
    pub model: usize,
    /// Base width (64 is the paper's ResNet; smaller trains faster).
    #[arg(long, default_value_t = 8, value_parser = positive())]
    pub width: usize,
    /// Batch size per replica.
    #[arg(long, default_value_t = 32, value_parser = positive())]
    pub batch_size: usize,
    /// Epochs to train.
    #[arg(long, default_value_t = 2, value_parser = positive())]
    pub epochs: usize,
    /// Train for exactly this many steps instead of whole epochs.
    #[arg(long, value_parser = positive())]
    pub steps: Option<usize>,
    /// Peak learning rate (after warm-up; cosine decay to zero).
    #[arg(long, default_value_t = 0.1)]
    pub lr: f64,
    /// Seed for initialisation, shuffling and augmentation.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Devices, one replica each, comma-separated: cpu, cpu:N, cuda:N, wgpu.
    #[arg(long, default_value = "cpu:0,cpu:1")]
    pub devices: String,
    /// Micro-batches accumulated per optimizer step (one all-reduce per step).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pub accumulation: usize,
    /// Gradient all-reduce element type.
    #[arg(long, value_enum, default_value_t = CompressionArg::F32)]
    pub compression: CompressionArg,
    /// Local SGD: average parameters every N steps instead of all-reducing gradients.
    #[arg(long, value_parser = positive())]
    pub local_sgd: Option<usize>,
    /// All-reduce after the whole backward instead of overlapping it segment by segment.
    #[arg(long)]
    pub no_overlap: bool,
    /// Gradient bucket cap in KiB (the first bucket is capped at a quarter of it). Smaller
    /// buckets start communicating earlier during backward.
    #[arg(long, default_value_t = 25 * 1024, value_parser = positive())]
    pub bucket_kb: usize,
    /// Compare parameter fingerprints across replicas every N steps (0 = never); a mismatch
    /// stops training with an error naming the first differing parameter.
    #[arg(long, default_value_t = 0)]
    pub check_every: usize,
    /// Size each replica's batch by its measured throughput (a few probe steps), keeping
    /// --batch-size x replicas as the global batch.
    #[arg(long)]
    pub balance: bool,
    /// Where gradients wait for their all-reduce: `auto` (host buffer on CPU, device buckets
    /// on accelerators), `host`, or `device` (Burn's native NCCL all-reduce when every
    /// replica has its own CUDA device, else one host copy per bucket).
    #[arg(long, value_enum, default_value_t = GradientPathArg::Auto)]
    pub gradient_path: GradientPathArg,
    /// Synchronised batch norm: normalise with the statistics of every replica's batch
    /// (exact backward; backward replays each residual block's forward once).
    #[arg(long)]
    pub sync_bn: bool,
    /// ZeRO-1: shard optimizer state over replicas.
    #[arg(long)]
    pub zero1: bool,
    /// Compute precision: f32, or mixed precision with f16 (loss-scaled) or bf16 compute and
    /// f32 master weights; every data-parallel option works with it. On the CPU backend (Flex) it
    /// saves activation memory, not time: kiln's convolution and batch norm compute half inputs
    /// in f32, so a bf16 step runs at about f32's speed, and an f16 step about 1.8x slower
    /// (Flex's f16 element-wise kernels; see the README's limitations).
    #[arg(long, value_enum, default_value_t = AmpArg::F32)]
    pub amp: AmpArg,
    /// Clip gradients to this global norm (over every parameter, after the all-reduce; over
    /// all shards with --zero1), like PyTorch's `clip_grad_norm_`.
    #[arg(long, value_parser = positive_norm)]
    pub clip_grad_norm: Option<f32>,
    /// How replicas communicate: `local` (threads of this process, one per --devices entry)
    /// or `mpi` (under mpirun: every process runs one replica per --devices entry; needs
    /// `--features mpi`).
    #[arg(long, value_enum, default_value_t = CommArg::Local)]
    pub comm: CommArg,
    /// CIFAR-10 binary directory (`cifar-10-batches-bin`); synthetic data when absent.
    #[arg(long)]
    pub data: Option<std::path::PathBuf>,
    /// Synthetic training samples (without --data).
    #[arg(long, default_value_t = 6_400, value_parser = positive())]
    pub synthetic_samples: usize,
    /// Loader worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Batches each worker prepares ahead.
    #[arg(long, default_value_t = 2, value_parser = positive())]
    pub prefetch: usize,
    /// Compute threads per replica (each replica runs Burn's CPU kernels in its own pool).
    /// Default: the machine's cores divided among this process's replicas.
    #[arg(long, value_parser = positive())]
    pub threads: Option<usize>,
    /// Pipeline parallelism: cut the model into this many stages, one per --devices entry
    /// (CPU entries may repeat: stages are threads), instead of data-parallel replicas.
    #[arg(long, value_parser = positive())]
    pub pipeline: Option<usize>,
    /// Micro-batches each batch is cut into (with --pipeline).
    #[arg(long, default_value_t = 4, value_parser = positive())]
    pub micro_batches: usize,
    /// Pipeline schedule: gpipe, 1f1b, or interleaved[:V] (V chunks per stage, default 2).
    #[arg(long, default_value = "1f1b")]
    pub schedule: kiln::pipeline::schedule::ScheduleKind,
    /// Print the pipeline schedule as a time x stage chart before training.
    #[arg(long)]
    pub show_schedule: bool,
    /// With --pipeline: segments per stage (per virtual stage with interleaving), in model
    /// order, e.g. `--split 4,6` (default: as even as possible by count). ResNet's segments
    /// are the stem, each block and the head.
    #[arg(long, value_delimiter = ',', value_parser = positive())]
    pub split: Option<Vec<usize>>,
    /// With --pipeline P: D data-parallel pipelines (--devices names D x P entries, pipeline
    /// after pipeline); each step takes D batches, and the copies of each stage add their
    /// gradients before the optimizer step.
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pub data_parallel: usize,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Refuses option combinations that would otherwise be silently ignored.
pub fn refuse_conflicts(args: &Args) -> Result<(), String> {
    if args.local_sgd.is_some() && args.zero1 {
        return Err(
            "--local-sgd and --zero1 conflict: ZeRO-1 shards the optimizer of a synchronous step"
                .into(),
        );
    }
    if args.local_sgd.is_some() && args.sync_bn {
        return Err(
            "--local-sgd and --sync-bn conflict: synchronised batch norm needs replicas in step"
                .into(),
        );
    }
    if args.pipeline.is_some() {
        // The pipeline runtime trains pipelines in this process, in f32 (MPI stages and
        // mixed precision come next).
        let unsupported = [
            (args.comm == CommArg::Mpi, "--comm mpi"),
            (args.amp != AmpArg::F32, "--amp"),
            (args.zero1, "--zero1"),
            (args.local_sgd.is_some(), "--local-sgd"),
            (args.compression != CompressionArg::F32, "--compression"),
            (args.sync_bn, "--sync-bn"),
            (args.balance, "--balance"),
            (args.accumulation != 1, "--accumulation"),
            (args.no_overlap, "--no-overlap"),
            (args.bucket_kb != 25 * 1024, "--bucket-kb"),
            (
                args.gradient_path != GradientPathArg::Auto,
                "--gradient-path",
            ),
            (args.check_every != 0, "--check-every"),
        ];
        let named: Vec<&str> = unsupported
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        if !named.is_empty() {
            return Err(format!(
                "--pipeline does not support {} yet: it trains f32 pipelines in this process",
                named.join(", ")
            ));
        }
    } else if args.show_schedule
        || args.micro_batches != 4
        || args.schedule != kiln::pipeline::schedule::ScheduleKind::OneFOneB
        || args.data_parallel != 1
        || args.split.is_some()
    {
        return Err(
            "--micro-batches, --schedule, --show-schedule, --data-parallel and --split need --pipeline"
                .into(),
        );
    }
    if args.balance && args.comm == CommArg::Mpi {
        return Err("--balance works with --comm local only".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Args, refuse_conflicts};

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("resnet_ddp").chain(extra.iter().copied()))
    }

    #[test]
    fn out_of_range_values_are_refused_when_parsing() {
        for bad in [
            ["--batch-size", "0"],
            ["--accumulation", "0"],
            ["--prefetch", "0"],
            ["--width", "0"],
            ["--local-sgd", "0"],
            ["--steps", "0"],
            ["--epochs", "0"],
            ["--bucket-kb", "0"],
            ["--threads", "0"],
            ["--clip-grad-norm", "0"],
            ["--clip-grad-norm", "nan"],
            ["--clip-grad-norm", "inf"],
            ["--amp", "fp8"],
            ["--compression", "int8"],
            ["--gradient-path", "disk"],
            ["--comm", "tcp"],
            ["--pipeline", "0"],
            ["--schedule", "zigzag"],
        ] {
            let error = parse(&bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert!(
                error.to_string().contains(bad[0]),
                "{bad:?}: the message names the option: {error}"
            );
        }
        assert!(parse(&["--threads", "2", "--local-sgd", "3"]).is_ok());
    }

    #[test]
    fn options_that_would_be_ignored_are_refused_with_the_reason() {
        let refused = |extra: &[&str], names: &[&str]| {
            let args = parse(extra).expect("parses");
            let message = refuse_conflicts(&args).expect_err("refused");
            for name in names {
                assert!(message.contains(name), "{extra:?}: {message}");
            }
        };
        refused(
            &["--local-sgd", "2", "--zero1"],
            &["--local-sgd", "--zero1"],
        );
        refused(
            &["--local-sgd", "2", "--sync-bn"],
            &["--local-sgd", "--sync-bn"],
        );
        refused(&["--balance", "--comm", "mpi"], &["--balance"]);
        refused(
            &["--pipeline", "2", "--amp", "bf16", "--zero1"],
            &["--pipeline", "--amp", "--zero1"],
        );
        refused(&["--schedule", "gpipe"], &["--schedule", "--pipeline"]);
        refused(
            &["--data-parallel", "2"],
            &["--data-parallel", "--pipeline"],
        );
        for fine in [
            &["--amp", "bf16"][..],
            // Mixed precision is a mode of the one data-parallel step: every option works.
            &["--amp", "bf16", "--zero1", "--clip-grad-norm", "1.5"],
            &[
                "--pipeline",
                "2",
                "--schedule",
                "interleaved:2",
                "--micro-batches",
                "8",
            ],
            &["--amp", "f16", "--local-sgd", "2", "--bucket-kb", "64"],
            &[
                "--amp",
                "bf16",
                "--compression",
                "f16",
                "--gradient-path",
                "device",
            ],
            &[
                "--amp",
                "bf16",
                "--no-overlap",
                "--check-every",
                "3",
                "--sync-bn",
            ],
            &["--zero1", "--compression", "bf16", "--bucket-kb", "64"],
            &["--local-sgd", "4", "--accumulation", "2"],
            &[
                "--sync-bn",
                "--gradient-path",
                "device",
                "--check-every",
                "2",
            ],
        ] {
            let args = parse(fine).expect("parses");
            assert!(
                refuse_conflicts(&args).is_ok(),
                "{fine:?} is a valid combination"
            );
        }
    }
}
