//! `cargo xtask gpu-bundle`: one archive that checks a GPU node without a Rust toolchain.
//!
//! It builds the example with `--features cuda` (release), strips it, and packs it with
//! `run.sh` (`xtask/gpu-bundle/run.sh`: the doctor, short trainings on every visible GPU, the
//! PyTorch peer when torch has CUDA, a summary) and the peer script into
//! `kiln-gpu-bundle.tar.xz`. Each binary links all of LLVM's targets (about 28 MB with xz),
//! so the bundle holds one binary and its checks are the binary's subcommands.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bundle's size target (compressed).
const SIZE_TARGET: u64 = 60 << 20;
/// The bundle's directory name inside the archive.
const NAME: &str = "kiln-gpu-bundle";

/// Options of `cargo xtask gpu-bundle`.
#[derive(clap::Args, Debug, Clone)]
pub struct GpuBundleArgs {
    /// Where the archive goes.
    #[arg(long, default_value = "target/gpu-bundle")]
    pub out: PathBuf,
    /// Pack this already built `resnet_ddp` instead of building it with `--features cuda`
    /// (e.g. one built on another machine, or a CPU build to try the bundle out).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Say what would be done, and do nothing.
    #[arg(long)]
    pub print: bool,
}

/// Why the bundle could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GpuBundleError {
    /// The offline LLVM is missing, so the cuda build would try GitHub.
    #[error(
        "the LLVM that --features cuda builds against is not installed: run `cargo xtask cuda-llvm` first"
    )]
    NoLlvm,
    /// A command failed.
    #[error("`{command}` failed{}", .why.as_deref().map(|w| format!(": {w}")).unwrap_or_default())]
    Command {
        /// What was run.
        command: String,
        /// Its error, if it said one.
        why: Option<String>,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> GpuBundleError + '_ {
    move |source| GpuBundleError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn run_command(command: &mut Command) -> Result<(), GpuBundleError> {
    let shown = format!("{command:?}").replace('"', "");
    println!("gpu-bundle: {shown}");
    let status = command.status().map_err(|err| GpuBundleError::Command {
        command: shown.clone(),
        why: Some(err.to_string()),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(GpuBundleError::Command {
            command: shown,
            why: None,
        })
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Lays out the bundle's directory in `staging`: the binary (stripped when `strip` is
/// there), `run.sh`, the peer script and a README.
pub fn stage(binary: &Path, staging: &Path) -> Result<(), GpuBundleError> {
    if staging.exists() {
        fs::remove_dir_all(staging).map_err(io_error(staging))?;
    }
    let bin_dir = staging.join("bin");
    let peer_dir = staging.join("peer");
    for dir in [&bin_dir, &peer_dir] {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
    }
    let packed = bin_dir.join("resnet_ddp");
    fs::copy(binary, &packed).map_err(io_error(binary))?;
    match Command::new("strip").arg(&packed).status() {
        Ok(status) if status.success() => {}
        _ => println!("gpu-bundle: `strip` failed or is missing: the binary keeps its symbols"),
    }
    let root = repo_root();
    use std::os::unix::fs::PermissionsExt;
    for (name, mode) in [
        ("run.sh", 0o755),
        ("picture.sh", 0o755),
        ("picture_report.py", 0o644),
    ] {
        let source = root.join("xtask/gpu-bundle").join(name);
        let copy = staging.join(name);
        fs::copy(&source, &copy).map_err(io_error(&source))?;
        fs::set_permissions(&copy, fs::Permissions::from_mode(mode)).map_err(io_error(&copy))?;
    }
    let peer = root.join("xtask/peer/resnet_peer.py");
    fs::copy(&peer, peer_dir.join("resnet_peer.py")).map_err(io_error(&peer))?;
    let readme = staging.join("README.txt");
    fs::write(
        &readme,
        "kiln GPU node check. Needs glibc 2.35+, libstdc++, the NVIDIA driver, and NVRTC and\n\
         NCCL (system libraries, or `pip install nvidia-cuda-nvrtc nvidia-nccl-cu13`: run.sh\n\
         finds the wheels' lib folders). Run ./run.sh (or ./run.sh --quick, or ./run.sh --picture:\n\
         everything in about 6 minutes, results.json and summary.md); the results and\n\
         results/summary.txt are written beside it. bin/resnet_ddp doctor alone checks the node.\n",
    )
    .map_err(io_error(&readme))?;
    Ok(())
}

/// `cargo xtask gpu-bundle`.
pub fn run(args: &GpuBundleArgs) -> Result<(), GpuBundleError> {
    let root = repo_root();
    let built = root.join("target/release/examples/resnet_ddp");
    let binary = args.binary.clone().unwrap_or_else(|| built.clone());
    let archive = args.out.join(format!("{NAME}.tar.xz"));
    if args.print {
        if args.binary.is_none() {
            println!(
                "gpu-bundle: would run cargo build --release --features cuda --example resnet_ddp"
            );
        }
        println!(
            "gpu-bundle: would pack {} (stripped), run.sh and the PyTorch peer into {}",
            binary.display(),
            archive.display()
        );
        return Ok(());
    }
    if args.binary.is_none() {
        if !crate::cuda_llvm::installed_at_default() {
            return Err(GpuBundleError::NoLlvm);
        }
        run_command(Command::new(env!("CARGO")).current_dir(&root).args([
            "build",
            "--release",
            "--features",
            "cuda",
            "--example",
            "resnet_ddp",
        ]))?;
    }
    let staging = args.out.join(NAME);
    stage(&binary, &staging)?;
    run_command(
        Command::new("tar")
            .env("XZ_OPT", "-6")
            .arg("-C")
            .arg(&args.out)
            .arg("-cJf")
            .arg(&archive)
            .arg(NAME),
    )?;
    let size = fs::metadata(&archive).map_err(io_error(&archive))?.len();
    println!(
        "gpu-bundle: {} ({:.1} MB; target ≤ {} MB){}",
        archive.display(),
        size as f64 / 1e6,
        SIZE_TARGET >> 20,
        if size > SIZE_TARGET {
            " — over the target"
        } else {
            ""
        }
    );
    println!("gpu-bundle: on the node: tar -xJf {NAME}.tar.xz && {NAME}/run.sh");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::stage;

    #[test]
    fn the_bundle_holds_the_binary_the_script_and_the_peer() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("fake");
        std::fs::write(&binary, "#!/bin/sh\n").unwrap();
        let staging = dir.path().join("bundle");
        stage(&binary, &staging).unwrap();
        for file in [
            "bin/resnet_ddp",
            "run.sh",
            "picture.sh",
            "picture_report.py",
            "peer/resnet_peer.py",
            "README.txt",
        ] {
            assert!(staging.join(file).is_file(), "{file} missing");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(staging.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
    }
}
