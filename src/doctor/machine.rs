//! The build, the CPU and the devices `--devices` names.

use std::time::Duration;

use crate::core::DeviceSpec;
use burn::tensor::{Device, Tensor};

use super::report::{Row, Status, bounded, row};

/// A small product on `device`, checked against its known value.
pub(super) fn exercise(device: Device) -> Result<(), String> {
    let a = Tensor::<2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &device);
    let product: Vec<f32> = a
        .clone()
        .matmul(a)
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|e| format!("{e:?}"))?;
    if product == [7.0, 10.0, 15.0, 22.0] {
        Ok(())
    } else {
        Err(format!("a 2×2 product came out as {product:?}"))
    }
}

pub(super) fn build_rows() -> Vec<Row> {
    let feature = |on: bool, name: &str| {
        if on {
            format!("+{name}")
        } else {
            format!("-{name}")
        }
    };
    let features = [
        feature(cfg!(feature = "cuda"), "cuda"),
        // `wgpu-bare`: the backend without autotune, fusion and the kernel cache (CI's build).
        if cfg!(feature = "wgpu") {
            feature(true, "wgpu")
        } else {
            feature(cfg!(feature = "wgpu-bare"), "wgpu-bare")
        },
        feature(cfg!(feature = "mpi"), "mpi"),
    ]
    .join(" ");
    vec![row(
        "build",
        Status::Ok,
        format!("kiln {} ({features})", env!("CARGO_PKG_VERSION")),
    )]
}

pub(super) fn cpu_rows() -> Vec<Row> {
    let model = crate::core::cpu_name();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[allow(unused_mut)]
    let mut simd: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        for (name, on) in [
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            (
                "avx512bf16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
            (
                "avx512fp16",
                std::arch::is_x86_feature_detected!("avx512fp16"),
            ),
        ] {
            if on {
                simd.push(name);
            }
        }
    }
    let flex = bounded(Duration::from_secs(30), || exercise(Device::flex())).and_then(|r| r);
    let flex = match flex {
        Ok(()) => row(
            "cpu (flex)",
            Status::Ok,
            format!("{model}; {cores} cores; {}", simd.join(" ")),
        ),
        Err(why) => row("cpu (flex)", Status::Fail, format!("{model}: {why}")),
    };
    vec![flex]
}

/// Opens every device `--devices` names and runs a product on it; the rows, and whether all
/// of them work.
pub(super) fn requested_rows(devices: &str) -> (Vec<Row>, bool) {
    let specs = match DeviceSpec::parse_list(devices) {
        Ok(specs) => specs,
        Err(err) => return (vec![row("--devices", Status::Fail, err.to_string())], false),
    };
    let mut rows = Vec::new();
    let mut all_usable = true;
    let mut seen = Vec::new();
    for spec in specs {
        if seen.contains(&spec) {
            continue;
        }
        seen.push(spec);
        let result = spec
            .device()
            .map_err(|err| err.to_string())
            .and_then(|device| {
                bounded(Duration::from_secs(120), move || exercise(device)).and_then(|r| r)
            });
        match result {
            Ok(()) => rows.push(row(
                "device",
                Status::Ok,
                format!("{spec}: opens and computes"),
            )),
            Err(why) => {
                all_usable = false;
                rows.push(row("device", Status::Fail, format!("{spec}: {why}")));
            }
        }
    }
    (rows, all_usable)
}
