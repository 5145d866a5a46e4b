//! The doctor's table: rows, their status and fix, and checks bounded in time.

use std::time::Duration;

use crate::core::panic_message;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works.
    Ok,
    /// Works, with a caveat.
    Note,
    /// Not built in or not applicable here.
    Skip,
    /// Does not work.
    Fail,
}

/// One row of the report.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was checked: `device`, `mpi`, `all-reduce`, ...
    pub area: &'static str,
    /// How it came out.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix a problem, when there is one.
    pub fix: Option<String>,
}

pub(super) fn row(area: &'static str, status: Status, detail: impl Into<String>) -> Row {
    Row {
        area,
        status,
        detail: detail.into(),
        fix: None,
    }
}

impl Row {
    pub(super) fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Runs `work` on its own thread, bounded by `limit`: a device that hangs while opening, or
/// panics inside its backend, is a failed check rather than a hung or crashed doctor.
pub(super) fn bounded<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
            .map_err(|payload| panic_message(payload.as_ref()));
        let _ = send.send(result);
    });
    match receive.recv_timeout(limit) {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {} s", limit.as_secs())),
    }
}

pub(super) fn render(rows: &[Row]) -> String {
    let width = rows.iter().map(|r| r.area.len()).max().unwrap_or(0);
    let mut out = String::new();
    for r in rows {
        let status = match r.status {
            Status::Ok => "ok",
            Status::Note => "note",
            Status::Skip => "-",
            Status::Fail => "FAIL",
        };
        out.push_str(&format!("{:<width$}  {status:<4}  {}\n", r.area, r.detail));
        if let Some(fix) = &r.fix {
            out.push_str(&format!("{:<width$}        fix: {fix}\n", ""));
        }
    }
    out
}
