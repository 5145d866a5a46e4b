use std::fs;
use std::path::{Path, PathBuf};

use super::{PinnedWheel, bundle_dir, install, installed, locate};
use crate::cuda_llvm::wheel::file_sha256;
use crate::cuda_llvm::wheel::tests::write_wheel;

/// A base wheel with a fake `llvm-config` that reports `version` and `targets`, and an
/// extra-targets wheel; their pins are the files' own digests.
fn fake_wheels(dir: &Path, version: &str, targets: &str) -> Vec<(PathBuf, PinnedWheel)> {
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in --version) echo {version};; --targets-built) echo {targets};; *) exit 1;; esac\n"
    );
    let base = dir.join("base.whl");
    write_wheel(
        &base,
        "base-1.dist-info",
        &[
            ("mlc_llvm_static/static/bin/llvm-config", &script, true),
            ("mlc_llvm_static/static/lib/libLLVMCore.a", "core", false),
            ("mlc_llvm_static/__init__.py", "", false),
        ],
        None,
    );
    let extra = dir.join("extra.whl");
    write_wheel(
        &extra,
        "extra-1.dist-info",
        &[(
            "mlc_llvm_static/static/lib/libLLVMNVPTXCodeGen.a",
            "nvptx",
            false,
        )],
        None,
    );
    let pin =
        |path: &Path| -> &'static str { Box::leak(file_sha256(path).unwrap().into_boxed_str()) };
    vec![
        (
            base.clone(),
            PinnedWheel {
                requirement: "base",
                file: "base.whl",
                sha256: pin(&base),
            },
        ),
        (
            extra.clone(),
            PinnedWheel {
                requirement: "extra",
                file: "extra.whl",
                sha256: pin(&extra),
            },
        ),
    ]
}

#[test]
fn the_bundle_directory_follows_the_bundlers_rule() {
    let expected = PathBuf::from("/data/tracel/tracel-llvm-23.1.0-4");
    assert_eq!(bundle_dir(Some("/data"), Some("/home/u")), Some(expected));
    // A relative XDG_DATA_HOME is ignored, as the XDG spec (and the `dirs` crate) says.
    let fallback = PathBuf::from("/home/u/.local/share/tracel/tracel-llvm-23.1.0-4");
    assert_eq!(
        bundle_dir(Some("rel"), Some("/home/u")),
        Some(fallback.clone())
    );
    assert_eq!(bundle_dir(None, Some("/home/u")), Some(fallback));
    assert_eq!(bundle_dir(None, None), None);
}

#[test]
fn installs_both_wheels_with_the_sentinel_and_is_found_installed() {
    let dir = tempfile::tempdir().unwrap();
    let wheels = fake_wheels(dir.path(), "23.1.1", "X86 NVPTX");
    let dest = dir.path().join("tracel/tracel-llvm-23.1.0-4");
    assert_eq!(installed(&dest), None);
    assert_eq!(install(&wheels, &dest).unwrap(), "23.1.1");
    assert!(dest.join(".tracel-llvm-installed").is_file());
    assert_eq!(
        fs::read_to_string(dest.join("lib/libLLVMNVPTXCodeGen.a")).unwrap(),
        "nvptx"
    );
    assert!(!dest.join("__init__.py").exists());
    assert_eq!(installed(&dest).as_deref(), Some("23.1.1"));
    // Installing again replaces the directory; nothing is left beside it.
    fs::write(dest.join("stale"), "x").unwrap();
    install(&wheels, &dest).unwrap();
    assert!(!dest.join("stale").exists());
    let beside: Vec<_> = fs::read_dir(dest.parent().unwrap()).unwrap().collect();
    assert_eq!(beside.len(), 1);
}

#[test]
fn a_wheel_with_another_digest_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut wheels = fake_wheels(dir.path(), "23.1.1", "X86 NVPTX");
    wheels[1].1.sha256 = "00";
    let dest = dir.path().join("llvm");
    let err = install(&wheels, &dest).unwrap_err().to_string();
    assert!(
        err.contains("extra.whl: SHA-256") && err.contains("expected 00"),
        "{err}"
    );
    assert!(!dest.exists());
}

#[test]
fn an_llvm_without_nvptx_or_of_another_version_is_refused_and_cleaned_up() {
    for (version, targets, expected) in [
        ("23.1.1", "X86", "no NVPTX target"),
        (
            "22.1.0",
            "X86 NVPTX",
            "LLVM 22.1.0, cubecl-llvm needs 23.1.x",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let wheels = fake_wheels(dir.path(), version, targets);
        let dest = dir.path().join("llvm");
        let err = install(&wheels, &dest).unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
        assert!(!dest.exists());
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("partial"))
            .collect();
        assert!(left.is_empty(), "staging left behind: {left:?}");
    }
}

#[test]
fn wheels_are_found_in_directories_or_as_files_and_a_missing_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let wheels = fake_wheels(dir.path(), "23.1.1", "X86 NVPTX");
    let pins: Vec<PinnedWheel> = wheels.iter().map(|(_, pin)| *pin).collect();
    let cache = dir.path().join("cache");
    let found = locate(&pins, &[dir.path().to_path_buf()], &cache).unwrap();
    assert_eq!(found, vec![wheels[0].0.clone(), wheels[1].0.clone()]);
    let found = locate(&pins, &[wheels[1].0.clone(), wheels[0].0.clone()], &cache).unwrap();
    assert_eq!(found[0], wheels[0].0);
    let err = locate(&pins, &[wheels[0].0.clone()], &cache)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no extra.whl in"), "{err}");
    let err = locate(&pins, &[], &cache).unwrap_err().to_string();
    assert!(err.contains("cache"), "{err}");
}
