//! The whole check: every row, and whether the run asked for can go ahead.

use super::comm::{in_process_bandwidth, mpi_rows};
use super::gpu::gpu_rows;
use super::machine::{build_rows, cpu_rows, requested_rows};
use super::report::{Row, Status, render};

/// The check of a build and machine for a run on some devices.
#[derive(Debug, Clone)]
pub struct Doctor {
    devices: String,
    mpi: bool,
}

impl Doctor {
    /// A check of the devices a run would use, as `--devices` names them
    /// ([`DeviceSpec::parse_list`](crate::core::DeviceSpec::parse_list): `cpu:0,cuda:1,wgpu`).
    pub fn new(devices: impl Into<String>) -> Self {
        Self {
            devices: devices.into(),
            mpi: false,
        }
    }

    /// Whether the run needs MPI: then MPI not built in, or failing to start, fails the check
    /// (otherwise it is a note, and MPI is only tried under `mpirun`).
    pub fn require_mpi(mut self, required: bool) -> Self {
        self.mpi = required;
        self
    }

    /// Runs every check (each bounded in time: a device that hangs or panics while opening
    /// is a failed row, not a hung check).
    pub fn check(&self) -> Checkup {
        let (requested, usable) = requested_rows(&self.devices);
        let mut rows = build_rows();
        rows.extend(cpu_rows());
        rows.extend(requested);
        rows.extend(gpu_rows());
        let mpi = mpi_rows(self.mpi);
        let mpi_failed = self.mpi && mpi.iter().any(|r| r.status == Status::Fail);
        rows.extend(mpi);
        rows.push(in_process_bandwidth());
        Checkup {
            rows,
            passed: usable && !mpi_failed,
        }
    }
}

/// What [`Doctor::check`] found: one row per check, shown as a table by `Display`.
#[derive(Debug)]
pub struct Checkup {
    rows: Vec<Row>,
    passed: bool,
}

impl Checkup {
    /// Every row, in the table's order.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// `false` when a requested device (or required MPI) cannot be used.
    pub fn passed(&self) -> bool {
        self.passed
    }
}

impl std::fmt::Display for Checkup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render(&self.rows))
    }
}
