//! The whole check: every row, printed as one table.

use super::comm::{in_process_bandwidth, mpi_rows};
use super::gpu::gpu_rows;
use super::machine::{build_rows, cpu_rows, requested_rows};
use super::report::{Status, render};

use crate::args::{Args, CommArg};

/// Prints the report; `false` when a requested device (or `--comm mpi`) cannot be used.
pub fn run(args: &Args) -> bool {
    let (requested, usable) = requested_rows(&args.devices);
    let mut rows = build_rows();
    rows.extend(cpu_rows());
    rows.extend(requested);
    rows.extend(gpu_rows());
    let mpi = mpi_rows(args);
    let mpi_failed = args.comm == CommArg::Mpi && mpi.iter().any(|r| r.status == Status::Fail);
    rows.extend(mpi);
    rows.push(in_process_bandwidth());
    print!("{}", render(&rows));
    usable && !mpi_failed
}
