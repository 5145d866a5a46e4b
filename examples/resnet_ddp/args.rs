//! The example's options, parsed and range-checked by clap (`conflicts.rs` refuses the
//! combinations that would otherwise be silently ignored).

use clap::{Parser, ValueEnum};
use kiln::amp::Precision;
use kiln::train::LrScaling;

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

/// A positive, finite learning rate (NaN or infinity would fail at the first step).
fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        Ok(rate) => Err(format!("must be positive and finite, not {rate}")),
        Err(err) => Err(format!("not a number: {err}")),
    }
}

/// Compute threads per replica: at least one, at most this machine's cores (more would only
/// contend, and an absurd count spent minutes spawning threads).
fn thread_count(text: &str) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(count) if count > cores => Err(format!(
            "{count} threads per replica, but this machine has {cores} cores"
        )),
        Ok(count) => Ok(count),
        Err(err) => Err(format!("not a count: {err}")),
    }
}

/// Loader worker threads: 0 (load on the training thread) up to 8 per core, at least 64 (a
/// worker is a thread; 100000 of them exhausted the process instead of an error).
fn worker_count(text: &str) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let most = (8 * cores).max(64);
    match text.parse::<usize>() {
        Ok(count) if count > most => Err(format!(
            "{count} loader workers, but at most {most} on this machine's {cores} cores"
        )),
        Ok(count) => Ok(count),
        Err(err) => Err(format!("not a count: {err}")),
    }
}

/// How replicas communicate.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommArg {
    Local,
    Mpi,
}

/// What the binary does instead of training.
#[derive(clap::Subcommand, Debug, Clone, PartialEq)]
pub enum Command {
    /// Check what this build and machine can do: compiled features, the CPU, every device
    /// `--devices` names (opened and used), CUDA's libraries, wgpu adapters, MPI (`--comm mpi`
    /// or under mpirun), an all-reduce bandwidth; a fix for each problem. Exits non-zero when a
    /// named device cannot be used.
    Doctor,
    /// Check data-parallel training on `--devices` against one device (f32 and half
    /// precision, host and device gradient paths, with a control that must fail); exits
    /// non-zero on a failure. On a GPU node: `selftest --devices cuda:0,cuda:0`.
    Selftest,
    /// Run a job and launch it again after it fails, like `torchrun --max-restarts`: for MPI
    /// jobs, which cannot restart themselves (`mpirun` ends every rank when one fails). The
    /// job resumes itself, so it needs `--run-dir`, `--checkpoint-every` and `--resume latest`:
    /// `launch --max-restarts 2 -- mpirun -np 2 resnet_ddp --comm mpi --devices cpu
    /// --run-dir runs/a --checkpoint-every 50 --resume latest`.
    Launch {
        /// Launches after a failure.
        #[arg(long, default_value_t = 1)]
        max_restarts: usize,
        /// Seconds a launch may run before it is killed as hung (and counted as a failure).
        #[arg(long)]
        attempt_timeout: Option<f64>,
        /// The job's command line, after `--`.
        #[arg(last = true, required = true)]
        job: Vec<String>,
    },
}

/// Train a ResNet with kiln.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// A task instead of training (`doctor`: check this build and machine).
    #[command(subcommand)]
    pub command: Option<Command>,
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
    /// Micro-batches accumulated per optimizer step (one all-reduce per step).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pub accumulation: usize,
    /// Compare parameter fingerprints across replicas every N steps (0 = never); a mismatch
    /// stops training with an error naming the first differing parameter.
    #[arg(long, default_value_t = 0)]
    pub check_every: usize,
    /// Size each replica's batch by its measured throughput (a few probe steps), keeping
    /// --batch-size x replicas as the global batch.
    #[arg(long)]
    pub balance: bool,
    /// Compute precision: f32, or mixed precision with f16 (loss-scaled) or bf16 compute and
    /// f32 master weights; every data-parallel option works with it. On the CPU backend (Flex) it
    /// saves activation memory, not time: kiln's convolution and batch norm compute half inputs
    /// in f32, so a bf16 step runs at about f32's speed, and an f16 step about 1.8x slower
    /// (Flex's f16 element-wise kernels; see the README's limitations).
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub amp: Precision,
    /// Clip gradients to this global norm (over every parameter, after the all-reduce; over
    /// all shards with --zero1), like PyTorch's `clip_grad_norm_`.
    #[arg(long, value_parser = positive_norm)]
    pub clip_grad_norm: Option<f32>,
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
    #[arg(long, default_value_t = 6_400, value_parser = positive())]
    pub synthetic_samples: usize,
    /// Loader worker threads (0: load on the training thread; at most 8 per core, 64 at least).
    #[arg(long, default_value_t = 1, value_parser = worker_count)]
    pub workers: usize,
    /// Batches each worker prepares ahead.
    #[arg(long, default_value_t = 2, value_parser = positive())]
    pub prefetch: usize,
    /// Compute threads per replica (each replica runs Burn's CPU kernels in its own pool).
    /// Default: the machine's cores divided among this process's replicas.
    #[arg(long, value_parser = thread_count)]
    pub threads: Option<usize>,
    /// GPU backends: where compiled kernels and autotune results are kept between processes
    /// (a directory, `default`: cubecl's — `target/environment` inside a cargo workspace, else
    /// ~/.cache/cubecl — or `off`). Processes may share one.
    #[arg(long, global = true, default_value = "default")]
    pub gpu_cache: kiln::core::gpu_runtime::GpuCache,
    /// GPU backends: how hard autotune searches on a kernel's first use (minimal, balanced,
    /// extensive, full; default cubecl's: balanced). Lower levels start faster.
    #[arg(long, global = true)]
    pub autotune_level: Option<kiln::core::gpu_runtime::AutotuneLevel>,
    /// GPU backends: append every kernel's name and GPU time to FILE (kernels timed one by
    /// one: a slower run); a line `kiln: steady state` marks the end of --profile-warmup steps.
    #[arg(long)]
    pub profile_kernels: Option<std::path::PathBuf>,
    /// With --profile-kernels: steps before the steady-state mark.
    #[arg(long, default_value_t = 3)]
    pub profile_warmup: usize,
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
