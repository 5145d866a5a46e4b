//! The self-test passes on CPU replicas, and refuses what it cannot check.

use burn::tensor::Device;
use kiln_amp::Precision;

use super::SelfTest;

/// Two CPU replicas: every check passes, the control among them (it passes by missing).
#[test]
fn the_selftest_passes_on_two_cpu_replicas_with_its_control() {
    let report = SelfTest::new(vec![Device::flex(), Device::flex()])
        .run()
        .unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!(report.checks.len(), 6, "{report}");
    assert!(report.checks.iter().any(|c| c.name.contains("control")));
    assert!(report.to_string().ends_with(&format!(
        "selftest: passed in {:.1} s",
        report.elapsed.as_secs_f64()
    )));
}

#[test]
fn no_device_or_an_f32_half_precision_is_refused() {
    let err = SelfTest::new(Vec::new()).run().unwrap_err();
    assert!(err.to_string().contains("at least one device"), "{err}");
    let err = SelfTest::new(vec![Device::flex()])
        .half_precision(Precision::F32)
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("F16 or Bf16"), "{err}");
}

/// A device list as `--devices` gives it: CPU entries pass; a device this build cannot open
/// is an error naming it, before any check runs.
#[test]
fn a_device_list_is_opened_or_refused_by_name() {
    let test = SelfTest::on("cpu:0,cpu:1").unwrap();
    assert_eq!((test.devices.len(), test.half), (2, Precision::Bf16));
    if !cfg!(feature = "cuda") {
        let err = SelfTest::on("cuda:0").unwrap_err();
        assert!(err.to_string().contains("cuda"), "{err}");
    }
    assert!(SelfTest::on("tpu:0").is_err());
}
