//! Where the bundler looks, which wheels fill it, and the install itself.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::wheel::{WheelError, file_sha256, unpack};

/// The directory tracel-llvm-bundler 23.1.0-4 (cubecl-llvm 0.11's) installs to, under the
/// user's local data directory.
const BUNDLE_DIR: &str = "tracel/tracel-llvm-23.1.0-4";
/// The file whose presence makes the bundler skip its download.
const SENTINEL: &str = ".tracel-llvm-installed";
/// The LLVM release the bundler's consumers are written against.
const LLVM_SERIES: &str = "23.1.";
/// The wheels' files live under this prefix; it becomes the bundle's root.
const PREFIX: &str = "mlc_llvm_static/static/";

/// A wheel kiln installs, with the SHA-256 of the file PyPI serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedWheel {
    /// `pip download` requirement.
    pub requirement: &'static str,
    /// The file name pip saves.
    pub file: &'static str,
    /// Lowercase hex SHA-256 of that file.
    pub sha256: &'static str,
}

/// The LLVM 23.1.1 static SDK (X86) and its extra targets (NVPTX, AMDGPU, …), Linux x86-64.
pub const WHEELS: [PinnedWheel; 2] = [
    PinnedWheel {
        requirement: "mlc-llvm-static==23.1.1.post0",
        file: "mlc_llvm_static-23.1.1.post0-py3-none-manylinux_2_28_x86_64.whl",
        sha256: "dcfec888abfaa418be77d41af585805f31463584cf9c90582992c00f392c1ac5",
    },
    PinnedWheel {
        requirement: "mlc-llvm-static-extra-targets==23.1.1.post0",
        file: "mlc_llvm_static_extra_targets-23.1.1.post0-py3-none-manylinux_2_28_x86_64.whl",
        sha256: "c36e834d9a4e9cf9759f27fece65711ece7a2fc2b5a96dbb15d66f5e9e787929",
    },
];

/// Options of `cargo xtask cuda-llvm`.
#[derive(clap::Args, Debug, Clone)]
pub struct CudaLlvmArgs {
    /// Take the wheels from these files or directories instead of `pip download` (for a
    /// machine with no package index: copy the two wheel files there first).
    #[arg(long, num_args = 1..)]
    pub from: Vec<PathBuf>,
    /// Say what would be done, and do nothing.
    #[arg(long)]
    pub print: bool,
    /// Install again even when a working install is there.
    #[arg(long)]
    pub force: bool,
    /// Install here instead of where tracel-llvm-bundler looks (for trying it out).
    #[arg(long)]
    pub dest: Option<PathBuf>,
}

/// Why the install failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaLlvmError {
    /// A wheel could not be read, did not match its pin, or did not unpack.
    #[error(transparent)]
    Wheel(#[from] WheelError),
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The wheels were not where the user said.
    #[error("no {file} in {searched}")]
    WheelNotFound {
        /// The file name looked for.
        file: String,
        /// Where it was looked for.
        searched: String,
    },
    /// `pip download` failed.
    #[error(
        "`{command}` failed: {why}\n(on a machine without a package index, download the two wheels elsewhere with `pip download --no-deps {requirements}` and pass them with --from)"
    )]
    Pip {
        /// The command run.
        command: String,
        /// Its error output.
        why: String,
        /// What to download elsewhere.
        requirements: String,
    },
    /// The unpacked LLVM does not answer as the bundler needs.
    #[error("the unpacked LLVM does not work: {0}")]
    Check(String),
    /// Neither `$XDG_DATA_HOME` nor `$HOME` is set.
    #[error("cannot tell the local data directory: set HOME (or XDG_DATA_HOME)")]
    NoDataDir,
    /// The pinned wheels are for another platform.
    #[error(
        "kiln pins the Linux x86-64 LLVM wheels; on this platform let the bundler download LLVM, or install it by hand into {0}"
    )]
    Platform(String),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CudaLlvmError + '_ {
    move |source| CudaLlvmError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where tracel-llvm-bundler looks: `dirs::data_local_dir()` on Linux, i.e. an absolute
/// `$XDG_DATA_HOME`, else `$HOME/.local/share`.
pub fn bundle_dir(xdg_data_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    let base = match xdg_data_home.filter(|dir| Path::new(dir).is_absolute()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(home.filter(|home| !home.is_empty())?).join(".local/share"),
    };
    Some(base.join(BUNDLE_DIR))
}

/// Runs `tool flag`, retrying while the kernel says the file is busy: `tool` was written
/// by this process a moment ago, and a child forked by another thread in that moment holds
/// the write descriptor until its own exec (ETXTBSY; the file is closed on exec, but not
/// before; seen in CI with tests running in parallel).
fn run_written_tool(tool: &Path, flag: &str) -> std::io::Result<std::process::Output> {
    let mut attempts = 0;
    loop {
        match Command::new(tool).arg(flag).output() {
            Err(err) if err.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => return result,
        }
    }
}

/// What `llvm-config` in `dir` says: `Ok(version)` when it is LLVM 23.1 with NVPTX built.
fn check_llvm(dir: &Path) -> Result<String, CudaLlvmError> {
    let tool = dir.join("bin/llvm-config");
    let ask = |flag: &str| -> Result<String, CudaLlvmError> {
        let output = run_written_tool(&tool, flag).map_err(|err| {
            CudaLlvmError::Check(format!(
                "cannot run {} ({err}; it is a Python script: python3 must be on PATH)",
                tool.display()
            ))
        })?;
        if !output.status.success() {
            return Err(CudaLlvmError::Check(format!(
                "`{} {flag}` failed: {}",
                tool.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let version = ask("--version")?;
    if !version.starts_with(LLVM_SERIES) {
        return Err(CudaLlvmError::Check(format!(
            "LLVM {version}, cubecl-llvm needs {LLVM_SERIES}x"
        )));
    }
    let targets = ask("--targets-built")?;
    if !targets.split_whitespace().any(|t| t == "NVPTX") {
        return Err(CudaLlvmError::Check(format!(
            "no NVPTX target (built: {targets}): the extra-targets wheel is missing"
        )));
    }
    Ok(version)
}

/// The wheel files: found under `from` (files or directories), or where `pip download` puts
/// them in `cache`.
fn locate(
    wheels: &[PinnedWheel],
    from: &[PathBuf],
    cache: &Path,
) -> Result<Vec<PathBuf>, CudaLlvmError> {
    let places: Vec<PathBuf> = if from.is_empty() {
        vec![cache.to_path_buf()]
    } else {
        from.to_vec()
    };
    wheels
        .iter()
        .map(|wheel| {
            places
                .iter()
                .map(|place| {
                    if place.is_dir() {
                        place.join(wheel.file)
                    } else {
                        place.clone()
                    }
                })
                .find(|path| {
                    path.file_name().is_some_and(|name| name == wheel.file) && path.is_file()
                })
                .ok_or_else(|| CudaLlvmError::WheelNotFound {
                    file: wheel.file.to_string(),
                    searched: places
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        })
        .collect()
}

fn pip_download(wheels: &[PinnedWheel], cache: &Path) -> Result<(), CudaLlvmError> {
    fs::create_dir_all(cache).map_err(io_error(cache))?;
    let requirements: Vec<&str> = wheels.iter().map(|w| w.requirement).collect();
    let mut command = Command::new("python3");
    command
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
        ])
        .arg(cache)
        .args(&requirements);
    let shown = format!(
        "python3 -m pip download --no-deps --only-binary :all: -d {} {}",
        cache.display(),
        requirements.join(" ")
    );
    println!("cuda-llvm: {shown}");
    let fail = |why: String| CudaLlvmError::Pip {
        command: shown.clone(),
        why,
        requirements: requirements.join(" "),
    };
    let output = command.output().map_err(|err| fail(err.to_string()))?;
    if !output.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// Checks each wheel against its pin, unpacks them together beside `dest`, checks the
/// result, then moves it to `dest` and writes the sentinel (last: an interrupted install
/// leaves no sentinel, so it is redone). Returns the LLVM version.
pub fn install(wheels: &[(PathBuf, PinnedWheel)], dest: &Path) -> Result<String, CudaLlvmError> {
    for (path, pin) in wheels {
        let actual = file_sha256(path)?;
        if actual != pin.sha256 {
            return Err(WheelError::Digest {
                path: path.clone(),
                actual,
                expected: pin.sha256.to_string(),
            }
            .into());
        }
    }
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io_error(parent))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(io_error(&staging))?;
    }
    let result = (|| {
        for (path, _) in wheels {
            let count = unpack(path, PREFIX, &staging)?;
            println!("cuda-llvm: {} files from {}", count, path.display());
        }
        let version = check_llvm(&staging)?;
        if dest.exists() {
            fs::remove_dir_all(dest).map_err(io_error(dest))?;
        }
        fs::rename(&staging, dest).map_err(io_error(dest))?;
        let sentinel = dest.join(SENTINEL);
        fs::write(&sentinel, b"").map_err(io_error(&sentinel))?;
        Ok(version)
    })();
    if result.is_err() && staging.exists() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

/// Whether a working install is at `dest`: its version, if so.
fn installed(dest: &Path) -> Option<String> {
    dest.join(SENTINEL)
        .is_file()
        .then(|| check_llvm(dest).ok())
        .flatten()
}

/// Where the bundler looks on this machine (its environment's `XDG_DATA_HOME` and `HOME`).
fn default_dest() -> Result<PathBuf, CudaLlvmError> {
    let home = std::env::var("HOME").ok();
    bundle_dir(
        std::env::var("XDG_DATA_HOME").ok().as_deref(),
        home.as_deref(),
    )
    .ok_or(CudaLlvmError::NoDataDir)
}

/// Whether a working install is where the bundler looks (for `gpu-bundle`).
pub fn installed_at_default() -> bool {
    default_dest().is_ok_and(|dest| installed(&dest).is_some())
}

/// Where Debian-like systems keep the linker's `libzstd.so` (`libzstd-dev`).
fn zstd_dev_present() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ]
    .iter()
    .any(|dir| Path::new(dir).join("libzstd.so").exists())
}

/// `cargo xtask cuda-llvm`.
pub fn run(args: &CudaLlvmArgs) -> Result<(), CudaLlvmError> {
    let home = std::env::var("HOME").ok();
    let dest = match &args.dest {
        Some(dest) => dest.clone(),
        None => default_dest()?,
    };
    if !(cfg!(target_os = "linux") && cfg!(target_arch = "x86_64")) {
        return Err(CudaLlvmError::Platform(dest.display().to_string()));
    }
    let cache = PathBuf::from(home.ok_or(CudaLlvmError::NoDataDir)?).join(".cache/kiln/cuda-llvm");
    let next = "then: cargo build --release --features cuda --example resnet_ddp";
    if !args.force
        && let Some(version) = installed(&dest)
    {
        println!(
            "cuda-llvm: LLVM {version} already installed at {} (--force installs it again); {next}",
            dest.display()
        );
        return Ok(());
    }
    if args.print {
        println!(
            "cuda-llvm: would install LLVM for cubecl-cuda into {}",
            dest.display()
        );
        if args.from.is_empty() {
            for wheel in &WHEELS {
                println!(
                    "  fetch {} with pip into {} (unless already there)",
                    wheel.requirement,
                    cache.display()
                );
            }
        } else {
            for wheel in &WHEELS {
                println!("  take {} from {:?}", wheel.file, args.from);
            }
        }
        for wheel in &WHEELS {
            println!("  check {} has SHA-256 {}", wheel.file, wheel.sha256);
        }
        println!("  unpack their {PREFIX} beside it, each file checked against the wheel's RECORD");
        println!("  check bin/llvm-config: version {LLVM_SERIES}x, NVPTX among its targets");
        println!("  move it into place and write {SENTINEL}");
        if !zstd_dev_present() {
            println!("  note: linking also needs libzstd (apt-get install libzstd-dev)");
        }
        return Ok(());
    }
    let found = match locate(&WHEELS, &args.from, &cache) {
        Ok(found) => found,
        Err(err) if !args.from.is_empty() => return Err(err),
        Err(_) => {
            pip_download(&WHEELS, &cache)?;
            locate(&WHEELS, &[], &cache)?
        }
    };
    let wheels: Vec<(PathBuf, PinnedWheel)> = found.into_iter().zip(WHEELS).collect();
    let version = install(&wheels, &dest)?;
    println!(
        "cuda-llvm: LLVM {version} installed at {}; {next}",
        dest.display()
    );
    if !zstd_dev_present() {
        println!(
            "cuda-llvm: note: linking needs libzstd, which is missing: apt-get install libzstd-dev"
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "install_tests.rs"]
mod tests;
