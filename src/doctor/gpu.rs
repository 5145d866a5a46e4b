//! CUDA's libraries and devices, wgpu's adapters.

use std::path::{Path, PathBuf};
#[cfg(any(feature = "cuda", feature = "wgpu-bare"))]
use std::time::Duration;

#[cfg(any(feature = "cuda", feature = "wgpu-bare"))]
use burn::tensor::Device;

#[cfg(any(feature = "cuda", feature = "wgpu-bare"))]
use super::report::bounded;
use super::report::{Row, Status, row};

/// Where the dynamic loader would find `names` (the first found): `LD_LIBRARY_PATH`, the
/// loader's cache, the usual directories.
fn find_library(names: &[&str]) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .collect();
    if let Ok(output) = std::process::Command::new("ldconfig").arg("-p").output() {
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            if let Some((_, path)) = line.split_once("=> ")
                && let Some(dir) = Path::new(path.trim()).parent()
            {
                dirs.push(dir.to_path_buf());
            }
        }
    }
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/cuda/lib64",
        ]
        .map(PathBuf::from),
    );
    dirs.iter()
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|path| path.exists())
}

/// The `lib` folders of the `nvidia-*` Python wheels, if python3 has any.
fn wheel_lib_dirs() -> Vec<PathBuf> {
    let Ok(output) = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
    else {
        return Vec::new();
    };
    let site = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let Ok(entries) = std::fs::read_dir(site.join("nvidia")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path().join("lib")))
        .filter(|lib| lib.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn cuda_library_rows() -> Vec<Row> {
    let wheels = wheel_lib_dirs();
    let mut rows = Vec::new();
    for (area, names, wheel) in [
        ("cuda driver", &["libcuda.so.1", "libcuda.so"][..], None),
        (
            "nvrtc",
            &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"][..],
            Some("nvidia-cuda-nvrtc"),
        ),
        (
            "nccl",
            &["libnccl.so.2", "libnccl.so"][..],
            Some("nvidia-nccl-cu13"),
        ),
    ] {
        if let Some(path) = find_library(names) {
            rows.push(row(area, Status::Ok, path.display().to_string()));
            continue;
        }
        let in_wheel = wheels
            .iter()
            .find(|dir| names.iter().any(|name| dir.join(name).exists()));
        let fix = match (in_wheel, wheel) {
            (Some(dir), _) => format!("export LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH", dir.display()),
            (None, Some(wheel)) => {
                format!("pip install {wheel}, then add its lib folder to LD_LIBRARY_PATH")
            }
            (None, None) => "install the NVIDIA driver (nvidia-smi must work)".to_string(),
        };
        rows.push(
            row(
                area,
                Status::Fail,
                format!("none of {} found", names.join(", ")),
            )
            .fix(fix),
        );
    }
    rows
}

pub(super) fn gpu_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    if cfg!(feature = "cuda") {
        rows.extend(cuda_library_rows());
        #[cfg(feature = "cuda")]
        rows.push(backend_row(
            "cuda",
            burn::tensor::DeviceType::Cuda,
            crate::core::CUDA_FIX,
        ));
    } else {
        rows.push(row("cuda", Status::Skip, "not built in").fix(
            "cargo xtask cuda-llvm, then cargo build --release --features cuda --example resnet_ddp",
        ));
    }
    #[cfg(feature = "wgpu-bare")]
    {
        rows.push(wgpu_adapter_row());
        rows.push(backend_row(
            "wgpu",
            burn::tensor::DeviceType::Wgpu,
            crate::core::WGPU_FIX,
        ));
    }
    #[cfg(not(feature = "wgpu-bare"))]
    rows.push(row("wgpu", Status::Skip, "not built in").fix("build with --features wgpu"));
    rows
}

/// The devices Burn enumerates for `kind`, each named by opening it.
#[cfg(any(feature = "cuda", feature = "wgpu-bare"))]
fn backend_row(area: &'static str, kind: burn::tensor::DeviceType, fix: &str) -> Row {
    let listed = bounded(Duration::from_secs(120), move || {
        Device::enumerate(kind)
            .into_iter()
            .map(|device| {
                device.identity().map_or_else(
                    || format!("{device:?}"),
                    |identity| identity.name.to_string(),
                )
            })
            .collect::<Vec<_>>()
    });
    match listed {
        Ok(names) if names.is_empty() => row(area, Status::Fail, "no device").fix(fix),
        Ok(names) => row(
            area,
            Status::Ok,
            format!("{} device(s): {}", names.len(), names.join("; ")),
        ),
        Err(why) => row(area, Status::Fail, why).fix(fix),
    }
}

/// Every adapter wgpu sees, with its graphics API and kind: without a Vulkan driver wgpu
/// falls back to GL (llvmpipe on a CPU), which Burn's kernels run on slowly, if at all.
#[cfg(feature = "wgpu-bare")]
fn wgpu_adapter_row() -> Row {
    use burn::backend::wgpu::wgpu;
    use std::future::Future;
    let adapters = bounded(Duration::from_secs(60), || {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let listing = std::pin::pin!(instance.enumerate_adapters(wgpu::Backends::all()));
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        // Native enumeration is synchronous: the future is ready at its first poll.
        match listing.poll(&mut context) {
            std::task::Poll::Ready(adapters) => adapters
                .iter()
                .map(|adapter| {
                    let info = adapter.get_info();
                    (
                        info.backend == wgpu::Backend::Vulkan
                            || info.backend == wgpu::Backend::Metal
                            || info.backend == wgpu::Backend::Dx12,
                        format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type),
                    )
                })
                .collect::<Vec<_>>(),
            std::task::Poll::Pending => Vec::new(),
        }
    });
    match adapters {
        Ok(list) if list.is_empty() => {
            row("wgpu adapters", Status::Fail, "none").fix(crate::core::WGPU_FIX)
        }
        Ok(list) => {
            let names = list
                .iter()
                .map(|(_, name)| name.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            if list.iter().any(|(native, _)| *native) {
                row("wgpu adapters", Status::Ok, names)
            } else {
                row("wgpu adapters", Status::Note, format!("{names}: GL only"))
                    .fix("install a Vulkan driver (Debian: apt-get install mesa-vulkan-drivers libvulkan1)")
            }
        }
        Err(why) => row("wgpu adapters", Status::Fail, why).fix(crate::core::WGPU_FIX),
    }
}
