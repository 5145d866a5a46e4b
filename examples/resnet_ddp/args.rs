//! The example's options, parsed and range-checked by clap (`conflicts.rs` refuses the
//! combinations that would otherwise be silently ignored).

use clap::{Parser, ValueEnum};
use kiln::train::{LrScaling, positive_count, positive_rate};

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
    /// A task instead of training (`doctor`: check this build and machine; `selftest`;
    /// `launch`).
    #[command(subcommand)]
    pub command: Option<kiln::doctor::Task>,
    /// ResNet depth: 18, 34, 50, 101 or 152.
    #[arg(long, default_value_t = 18)]
    pub model: usize,
    /// Base width (64 is the paper's ResNet; smaller trains faster).
    #[arg(long, default_value_t = 8, value_parser = positive_count)]
    pub width: usize,
    /// Batch size per replica.
    #[arg(long, default_value_t = 32, value_parser = positive_count)]
    pub batch_size: usize,
    /// Epochs to train.
    #[arg(long, default_value_t = 2, value_parser = positive_count)]
    pub epochs: usize,
    /// Train for exactly this many steps instead of whole epochs.
    #[arg(long, value_parser = positive_count)]
    pub steps: Option<usize>,
    /// Peak learning rate (after warm-up; cosine decay to zero).
    #[arg(long, default_value_t = 0.1, value_parser = positive_rate)]
    pub lr: f64,
    /// Scale --lr with the global batch: `linear` takes --lr as the rate for 256 samples per
    /// step and multiplies it by global batch / 256 (Goyal et al., 2017; the warm-up over the
    /// first tenth of training stays).
    #[arg(long, value_enum, default_value_t = LrScaling::None)]
    pub lr_scaling: LrScaling,
    /// Seed for initialisation, shuffling and augmentation.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Devices, one replica each, comma-separated: cpu, cpu:N, cuda:N, wgpu.
    #[arg(long, default_value = "cpu:0,cpu:1", global = true)]
    pub devices: String,
    /// Size each replica's batch by its measured throughput (a few probe steps), keeping
    /// --batch-size x replicas as the global batch.
    #[arg(long)]
    pub balance: bool,
    /// How replicas communicate: `local` (threads of this process, one per --devices entry)
    /// or `mpi` (under mpirun: every process runs one replica per --devices entry; with
    /// --pipeline P --data-parallel D, `mpirun -np D*P` and one --devices entry: each process
    /// runs one stage, rank = pipeline * P + stage; needs `--features mpi`).
    #[arg(long, value_enum, default_value_t = CommArg::Local, global = true)]
    pub comm: CommArg,
    /// CIFAR-10 binary directory (`cifar-10-batches-bin`); synthetic data when absent.
    #[arg(long)]
    pub data: Option<std::path::PathBuf>,
    /// Synthetic training samples (without --data).
    #[arg(long, default_value_t = 6_400, value_parser = positive_count)]
    pub synthetic_samples: usize,
    /// The loader: `--workers`, `--prefetch`.
    #[command(flatten)]
    pub loader: kiln::data::LoaderOptions,
    /// The step: `--amp`, `--clip-grad-norm`, `--accumulation`, `--check-every`, `--threads`.
    #[command(flatten)]
    pub step: kiln::train::StepOptions,
    /// GPU backends: `--gpu-cache`, `--autotune-level`, `--profile-kernels`,
    /// `--profile-warmup`.
    #[command(flatten)]
    pub gpu: kiln::core::gpu_options::GpuOptions,
    /// Data-parallel options: `--compression`, `--local-sgd`, `--no-overlap`, `--bucket-kb`,
    /// `--gradient-path`, `--sync-bn`, `--zero1`.
    #[command(flatten)]
    pub ddp: kiln::ddp::DdpOptions,
    /// Pipelines by hand: `--pipeline`, `--micro-batches`, `--schedule`, `--show-schedule`,
    /// `--split`, `--data-parallel` (with --comm mpi, D x P processes, one stage each).
    #[command(flatten)]
    pub pipeline: kiln::pipeline::PipelineOptions,
    /// The planner: `--plan`, `--global-batch`, `--device-memory`, `--profile-cache`,
    /// `--predict`, `--save-plan`.
    #[command(flatten)]
    pub planner: kiln::planner::PlanOptions,
    /// The run's directory, checkpoints, resume and restarts (`--run-dir`,
    /// `--checkpoint-every`, `--keep`, `--resume`, `--max-restarts`).
    #[command(flatten)]
    pub run: kiln::checkpoint::RunOptions,
    /// Fault injection for testing restarts: `panic-at-step:N` makes the last replica panic
    /// at optimizer step N (with --pipeline: every pipeline's last stage), once per process,
    /// and only in a job's first launch (`launch` relaunches it without the fault).
    #[arg(long)]
    pub inject_fault: Option<kiln::train::InjectedFault>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
