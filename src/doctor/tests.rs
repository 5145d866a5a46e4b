//! The doctor's checks that need no GPU.

use std::time::Duration;

use super::comm::in_process_bandwidth;
use super::machine::requested_rows;
use super::report::{Status, bounded, render, row};

#[test]
fn a_usable_cpu_device_passes_and_a_missing_backend_fails_with_the_feature() {
    let (rows, usable) = requested_rows("cpu:0,cpu:1,cpu:0");
    assert!(usable);
    assert_eq!(rows.len(), 2, "each device once");
    if !cfg!(feature = "cuda") {
        let (rows, usable) = requested_rows("cpu,cuda:3");
        assert!(!usable);
        assert!(
            rows[1].detail.contains("--features cuda"),
            "{}",
            rows[1].detail
        );
    }
    let (rows, usable) = requested_rows("tpu:0");
    assert!(!usable && rows[0].detail.contains("unknown device"));
}

#[test]
fn a_panicking_or_hanging_check_is_a_failed_row_not_a_crash() {
    let panicked = bounded(Duration::from_secs(5), || -> () {
        panic!("inside the backend")
    });
    assert_eq!(panicked.unwrap_err(), "inside the backend");
    let hung = bounded(Duration::from_millis(50), || {
        std::thread::sleep(Duration::from_secs(5))
    });
    assert!(hung.unwrap_err().contains("no answer"));
}

#[test]
fn the_in_process_bandwidth_is_measured_and_the_table_shows_fixes() {
    let bandwidth = in_process_bandwidth();
    assert_eq!(bandwidth.status, Status::Ok, "{}", bandwidth.detail);
    assert!(bandwidth.detail.contains("GB/s"));
    let table = render(&[row("nccl", Status::Fail, "none found").fix("pip install x")]);
    assert_eq!(
        table,
        "nccl  FAIL  none found\n            fix: pip install x\n"
    );
}
