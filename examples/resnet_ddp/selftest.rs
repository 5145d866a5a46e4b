//! `resnet_ddp selftest`: kiln's data-parallel and mixed-precision equivalence checks
//! ([`kiln::ddp::SelfTest`]) on the devices `--devices` names — so a GPU node checks them
//! from the bundle without a Rust toolchain (`--devices cuda:0,cuda:0`, or one entry per GPU),
//! and CI checks the same code on CPU devices.

use kiln::amp::Precision;
use kiln::core::DeviceSpec;
use kiln::ddp::SelfTest;

/// Runs every check on `--devices`; prints a line each; whether all passed.
pub fn run(devices: &str) -> bool {
    let report = DeviceSpec::parse_list(devices)
        .map_err(|e| e.to_string())
        .and_then(|specs| {
            let opened = specs
                .iter()
                .map(|s| s.device().map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            // Half precision: bf16, except on wgpu (lavapipe and many GPUs there have f16 only).
            let half = if specs[0] == DeviceSpec::Wgpu {
                Precision::F16
            } else {
                Precision::Bf16
            };
            SelfTest::new(opened)
                .half_precision(half)
                .run()
                .map_err(|e| e.to_string())
        });
    match report {
        Ok(report) => {
            println!("{report}");
            report.passed()
        }
        Err(err) => {
            println!("selftest: {err}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_selftest_passes_on_cpu_replicas_and_refuses_a_missing_device() {
        assert!(super::run("cpu:0,cpu:1"));
        if !cfg!(feature = "cuda") {
            assert!(!super::run("cuda:0"));
        }
    }
}
