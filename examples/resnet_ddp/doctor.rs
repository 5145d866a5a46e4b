//! `resnet_ddp doctor`: what this build and this machine can do, checked before a training run
//! (and on a GPU node without a Rust toolchain, since the binary carries it). One table:
//! the compiled features, the CPU, every device it can open, CUDA's libraries, MPI, an
//! all-reduce bandwidth per available transport, and for each problem its fix. The exit code
//! is non-zero when a device named by `--devices` cannot be used.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor};
use kiln::comm::{InProcessGroup, ReduceOp};
use kiln::core::{DeviceSpec, panic_message};

use crate::args::{Args, CommArg};

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    /// Works, with a caveat.
    #[cfg_attr(not(any(feature = "mpi", feature = "wgpu")), allow(dead_code))]
    Note,
    /// Not built in or not applicable here.
    Skip,
    Fail,
}

/// One row of the report.
struct Row {
    area: &'static str,
    status: Status,
    detail: String,
    fix: Option<String>,
}

fn row(area: &'static str, status: Status, detail: impl Into<String>) -> Row {
    Row {
        area,
        status,
        detail: detail.into(),
        fix: None,
    }
}

impl Row {
    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Runs `work` on its own thread, bounded by `limit`: a device that hangs while opening, or
/// panics inside its backend, is a failed check rather than a hung or crashed doctor.
fn bounded<T: Send + 'static>(
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

/// A small product on `device`, checked against its known value.
fn exercise(device: Device) -> Result<(), String> {
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

fn build_rows() -> Vec<Row> {
    let feature = |on: bool, name: &str| {
        if on {
            format!("+{name}")
        } else {
            format!("-{name}")
        }
    };
    let features = [
        feature(cfg!(feature = "cuda"), "cuda"),
        feature(cfg!(feature = "wgpu"), "wgpu"),
        feature(cfg!(feature = "mpi"), "mpi"),
    ]
    .join(" ");
    vec![row(
        "build",
        Status::Ok,
        format!("kiln {} ({features})", env!("CARGO_PKG_VERSION")),
    )]
}

fn cpu_rows() -> Vec<Row> {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|name| name.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
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
fn requested_rows(devices: &str) -> (Vec<Row>, bool) {
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

fn gpu_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    if cfg!(feature = "cuda") {
        rows.extend(cuda_library_rows());
        #[cfg(feature = "cuda")]
        rows.push(backend_row(
            "cuda",
            burn::tensor::DeviceType::Cuda,
            kiln::core::CUDA_FIX,
        ));
    } else {
        rows.push(row("cuda", Status::Skip, "not built in").fix(
            "cargo xtask cuda-llvm, then cargo build --release --features cuda --example resnet_ddp",
        ));
    }
    #[cfg(feature = "wgpu")]
    {
        rows.push(wgpu_adapter_row());
        rows.push(backend_row(
            "wgpu",
            burn::tensor::DeviceType::Wgpu,
            kiln::core::WGPU_FIX,
        ));
    }
    #[cfg(not(feature = "wgpu"))]
    rows.push(row("wgpu", Status::Skip, "not built in").fix("build with --features wgpu"));
    rows
}

/// The devices Burn enumerates for `kind`, each named by opening it.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
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
#[cfg(feature = "wgpu")]
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
            row("wgpu adapters", Status::Fail, "none").fix(kiln::core::WGPU_FIX)
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
        Err(why) => row("wgpu adapters", Status::Fail, why).fix(kiln::core::WGPU_FIX),
    }
}

/// All-reduce bandwidth between two threads of this process over ~1 s (algorithm bandwidth:
/// buffer bytes ÷ time per all-reduce).
fn in_process_bandwidth() -> Row {
    const ELEMENTS: usize = 4 << 20;
    let result = bounded(Duration::from_secs(30), || {
        let comms = InProcessGroup::new(2).build();
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                std::thread::spawn(move || -> Result<(usize, f64), String> {
                    let mut data = vec![1.0f32; ELEMENTS];
                    let start = Instant::now();
                    let mut rounds = 0;
                    // Rank 0 decides when to stop, so both ranks run the same rounds.
                    loop {
                        comm.all_reduce(&mut data, ReduceOp::Sum)
                            .map_err(|e| e.to_string())?;
                        rounds += 1;
                        let mut go = [f32::from(u8::from(
                            start.elapsed() < Duration::from_secs(1),
                        ))];
                        comm.broadcast(&mut go, 0).map_err(|e| e.to_string())?;
                        if go[0] == 0.0 {
                            return Ok((rounds, start.elapsed().as_secs_f64()));
                        }
                    }
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        match results.into_iter().next() {
            Some(Ok(Ok((rounds, seconds)))) => Ok(rounds as f64 * (ELEMENTS * 4) as f64 / seconds),
            Some(Ok(Err(err))) => Err(err),
            _ => Err("a rank panicked".to_string()),
        }
    })
    .and_then(|r| r);
    match result {
        Ok(bytes_per_second) => row(
            "all-reduce",
            Status::Ok,
            format!(
                "in-process, 2 threads, 16 MiB: {:.2} GB/s",
                bytes_per_second / 1e9
            ),
        ),
        Err(why) => row("all-reduce", Status::Fail, format!("in-process: {why}")),
    }
}

#[cfg(feature = "mpi")]
fn mpi_rows(args: &Args) -> Vec<Row> {
    use kiln::comm::MpiCommunicator;
    let version = MpiCommunicator::library_version();
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|var| std::env::var_os(var).is_some());
    if args.comm != CommArg::Mpi && !launched {
        return vec![row(
            "mpi",
            Status::Note,
            format!("{version}; not started (run under mpirun, or pass --comm mpi)"),
        )];
    }
    match MpiCommunicator::world(Duration::from_secs(60)) {
        Ok(world) => {
            let threads = if MpiCommunicator::thread_multiple() {
                "MPI_THREAD_MULTIPLE"
            } else {
                "no MPI_THREAD_MULTIPLE (pipelines across processes refused)"
            };
            let mut rows = vec![row(
                "mpi",
                Status::Ok,
                format!(
                    "{version}; rank {} of {}; {threads}",
                    world.rank(),
                    world.world_size()
                ),
            )];
            if world.world_size() > 1 {
                let mut data = vec![1.0f32; 1 << 20];
                let start = Instant::now();
                let mut rounds = 0usize;
                let mut failed = None;
                while failed.is_none() {
                    if let Err(err) = world.all_reduce(&mut data, ReduceOp::Sum) {
                        failed = Some(err.to_string());
                        break;
                    }
                    rounds += 1;
                    let mut go = [f32::from(u8::from(
                        start.elapsed() < Duration::from_secs(1),
                    ))];
                    if let Err(err) = world.broadcast(&mut go, 0) {
                        failed = Some(err.to_string());
                    } else if go[0] == 0.0 {
                        break;
                    }
                }
                rows.push(match failed {
                    None => row(
                        "all-reduce",
                        Status::Ok,
                        format!(
                            "MPI, {} ranks, 4 MiB: {:.2} GB/s",
                            world.world_size(),
                            rounds as f64 * 4.0 * (1 << 20) as f64
                                / start.elapsed().as_secs_f64()
                                / 1e9
                        ),
                    ),
                    Some(err) => row("all-reduce", Status::Fail, format!("MPI: {err}")),
                });
            }
            rows
        }
        Err(err) => vec![row("mpi", Status::Fail, format!("{version}: {err}"))],
    }
}

#[cfg(not(feature = "mpi"))]
fn mpi_rows(args: &Args) -> Vec<Row> {
    let fix = "apt-get install libopenmpi-dev openmpi-bin, then cargo build --release --features mpi --example resnet_ddp";
    let status = if args.comm == CommArg::Mpi {
        Status::Fail
    } else {
        Status::Skip
    };
    vec![row("mpi", status, "not built in").fix(fix)]
}

/// Prints the report; `Ok(false)` when a requested device (or `--comm mpi`) cannot be used.
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

fn render(rows: &[Row]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
