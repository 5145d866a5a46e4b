//! `cargo xtask cuda-llvm`: installs the LLVM that Burn's CUDA backend builds against, without
//! GitHub.
//!
//! burn-cuda → cubecl-cuda → cubecl-llvm → tracel-llvm-bundler downloads an LLVM 23.1 bundle
//! from GitHub in its build script, unless its directory already holds the sentinel
//! `.tracel-llvm-installed`; it then only asks `bin/llvm-config` there for libraries and flags.
//! The PyPI wheels `mlc-llvm-static` and `mlc-llvm-static-extra-targets` (LLVM 23.1.1 static
//! libraries, headers and a relocatable `llvm-config`, X86 plus NVPTX and the other targets)
//! have exactly that layout under `mlc_llvm_static/static/`. This task fetches them with
//! `pip download` (or takes them from files the user names, for machines with no index at
//! all), checks each wheel's SHA-256 against the digest pinned here and every unpacked file
//! against the wheel's own RECORD, unpacks both into a temporary directory beside the
//! bundler's, checks the result with its `llvm-config`, and only then moves it into place and
//! writes the sentinel.

mod install;
mod wheel;

pub use install::{CudaLlvmArgs, installed_at_default, run};
