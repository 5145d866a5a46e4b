//! Burn's features that kiln's speed depends on are really enabled.
//!
//! kiln declares burn with `default-features = false`, which also drops what Burn's defaults
//! give its backends (Flex's threads and SIMD paths; the GPU backends' autotune, fusion and
//! on-disk kernel cache). Losing one again costs 2-10x silently (minutes of start-up on a GPU),
//! so this test reads the resolved feature graph. It also holds kiln's own default: the option
//! types as clap arguments, which `default-features = false` leaves out.

use std::process::Command;

/// The features of `package` that cargo resolves for the workspace (default features).
fn resolved_features(package: &str) -> String {
    resolved_features_with(package, None)
}

/// The features of `package` that cargo resolves for the workspace with kiln's `features`.
/// Offline first; a feature whose crates were never downloaded (the GPU backends' before any
/// GPU build) resolves with the registry instead.
fn resolved_features_with(package: &str, features: Option<&str>) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = |offline: bool| {
        let mut args = vec!["tree", "-e", "features", "-i", package];
        if offline {
            args.push("--offline");
        }
        if let Some(features) = features {
            args.extend(["--features", features]);
        }
        Command::new(&cargo)
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo runs")
    };
    let mut output = tree(true);
    if !output.status.success() && features.is_some() {
        output = tree(false);
    }
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[test]
fn flex_runs_multi_threaded_with_simd() {
    let tree = resolved_features("burn-flex");
    for feature in ["rayon", "simd"] {
        assert!(
            tree.contains(&format!("burn-flex feature \"{feature}\"")),
            "burn-flex lost its `{feature}` feature; name it in the root Cargo.toml's burn \
             features:\n{tree}"
        );
    }
    // kiln's kernels dispatch their loops through pulp: without `x86-v3` an AVX2 CPU without
    // AVX-512 runs them in SSE2 (the GPT's GELU ran 4x slower than libm's scalar one).
    let pulp = resolved_features("pulp");
    for feature in ["x86-v3", "x86-v4"] {
        assert!(
            pulp.contains(&format!("pulp feature \"{feature}\"")),
            "pulp lost its `{feature}` feature; name it in kiln-kernels' Cargo.toml:\n{pulp}"
        );
    }
    let gemm = resolved_features("gemm");
    assert!(
        gemm.contains("gemm feature \"rayon\""),
        "gemm runs single-threaded:\n{gemm}"
    );
}

/// What Burn's defaults give its GPU backends, under kiln's `cuda` and `wgpu` features: kernel
/// selection by measurement (`autotune`), op fusion (`fusion`) and the on-disk cache of compiled
/// kernels and autotune results (`persistence`: without it every process compiles and tunes
/// everything again, 1-2 minutes on an H200 before the first step).
#[test]
fn gpu_backends_tune_fuse_and_cache() {
    for features in ["cuda", "wgpu"] {
        let cubecl = resolved_features_with("burn-cubecl", Some(features));
        for feature in ["autotune", "fusion", "persistence"] {
            assert!(
                cubecl.contains(&format!("burn-cubecl feature \"{feature}\"")),
                "--features {features}: burn-cubecl lost `{feature}`; name it in kiln-core's \
                 `{features}` feature:\n{cubecl}"
            );
        }
        let runtime = resolved_features_with("cubecl-runtime", Some(features));
        assert!(
            runtime.contains("cubecl-runtime feature \"persistence\""),
            "--features {features}: cubecl-runtime has no on-disk cache:\n{runtime}"
        );
    }
}

/// `wgpu-bare` is Burn's wgpu backend alone: CI builds it to execute the wgpu checks within
/// its time, so autotune, fusion and the persistent cache (the full `wgpu` feature's, about
/// twice the build) must stay out of it, while the backend itself is in.
#[test]
fn the_bare_wgpu_feature_leaves_the_tuning_features_out() {
    let cubecl = resolved_features_with("burn-cubecl", Some("wgpu-bare"));
    assert!(
        cubecl.contains("burn-cubecl feature \"wgpu\""),
        "--features wgpu-bare: no wgpu backend:\n{cubecl}"
    );
    for feature in ["autotune", "fusion", "persistence"] {
        assert!(
            !cubecl.contains(&format!("burn-cubecl feature \"{feature}\"")),
            "--features wgpu-bare pulls in burn-cubecl's `{feature}`:\n{cubecl}"
        );
    }
}

/// The option types are clap arguments by default (the facade's `clap` feature, a default
/// one, enables every crate's), and a library build without default features leaves clap out
/// of its normal dependencies (the examples' dev-dependency aside).
#[test]
fn clap_is_a_default_feature_that_reaches_every_option_crate_and_can_be_left_out() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = |extra: &[&str]| {
        let mut args = vec!["tree", "-e", "normal,features", "-i", "clap", "-p", "kiln"];
        args.extend(["--offline"]);
        args.extend(extra);
        let output = Command::new(&cargo)
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    };
    let default = tree(&[]);
    for package in [
        "kiln",
        "kiln-core",
        "kiln-data",
        "kiln-amp",
        "kiln-train",
        "kiln-checkpoint",
        "kiln-ddp",
        "kiln-pipeline",
        "kiln-planner",
    ] {
        assert!(
            default.contains(&format!("{package} feature \"clap\"")),
            "{package}'s option types are not clap arguments by default:\n{default}"
        );
    }
    let without = tree(&["--no-default-features"]);
    assert!(
        !without.contains("clap v"),
        "clap without default features:\n{without}"
    );
}
