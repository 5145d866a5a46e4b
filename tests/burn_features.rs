//! Burn's features that kiln's speed depends on are really enabled.
//!
//! kiln declares burn with `default-features = false`, which also drops what Burn's defaults
//! give its backends (Flex's threads and SIMD paths). Losing one again costs 2-10x silently,
//! so this test reads the resolved feature graph.

use std::process::Command;

/// The features of `package` that cargo resolves for the workspace (default features).
fn resolved_features(package: &str) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["tree", "--offline", "-e", "features", "-i", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
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
    let gemm = resolved_features("gemm");
    assert!(
        gemm.contains("gemm feature \"rayon\""),
        "gemm runs single-threaded:\n{gemm}"
    );
}
