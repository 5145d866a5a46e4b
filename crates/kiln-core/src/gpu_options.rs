//! The GPU runtime's settings as a program's options (`--gpu-cache`, `--autotune-level`,
//! `--profile-kernels`, `--profile-warmup`): clap arguments with the `clap` feature, checked
//! against the devices a run names.

use std::path::PathBuf;

use crate::DeviceSpec;
use crate::gpu_runtime::{AutotuneLevel, GpuCache, GpuRuntime, GpuRuntimeError};

/// The GPU runtime's options of a training program, to flatten into its own clap arguments
/// (feature `clap`) or fill by hand.
///
/// ```
/// use kiln_core::DeviceSpec;
/// use kiln_core::gpu_options::GpuOptions;
///
/// let options = GpuOptions {
///     profile_kernels: Some("kernels.txt".into()),
///     ..GpuOptions::default()
/// };
/// // cubecl's profiler sees GPU kernels only: on CPU devices the file would stay empty.
/// let cpus = DeviceSpec::parse_list("cpu:0,cpu:1").unwrap();
/// assert!(options.check(&cpus).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct GpuOptions {
    /// GPU backends: where compiled kernels and autotune results are kept between processes
    /// (a directory; `default`: kept, in cubecl's place — `target/environment` inside a cargo
    /// workspace, else ~/.cache/cubecl; or `off`). Processes may share one.
    #[cfg_attr(feature = "clap", arg(long, global = true, default_value = "default"))]
    pub gpu_cache: GpuCache,
    /// GPU backends: how hard autotune searches on a kernel's first use (minimal, balanced,
    /// extensive, full; default cubecl's: balanced). Lower levels start faster.
    #[cfg_attr(feature = "clap", arg(long, global = true))]
    pub autotune_level: Option<AutotuneLevel>,
    /// GPU backends: append every kernel's name and GPU time to FILE (kernels timed one by
    /// one: a slower run); a line `kiln: steady state` marks the end of --profile-warmup steps.
    #[cfg_attr(feature = "clap", arg(long))]
    pub profile_kernels: Option<PathBuf>,
    /// With --profile-kernels: steps before the steady-state mark.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3))]
    pub profile_warmup: usize,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            gpu_cache: GpuCache::Default,
            autotune_level: None,
            profile_kernels: None,
            profile_warmup: 3,
        }
    }
}

impl GpuOptions {
    /// The runtime settings these options ask for.
    pub fn runtime(&self) -> GpuRuntime {
        GpuRuntime {
            cache: self.gpu_cache.clone(),
            autotune: self.autotune_level,
            kernel_profile: self.profile_kernels.clone(),
        }
    }

    /// Fixes the settings for the process ([`GpuRuntime::apply`]): call it before any GPU
    /// device is used.
    ///
    /// # Errors
    /// As [`GpuRuntime::apply`]: a setting this build cannot honour, or one given too late.
    pub fn apply(&self) -> Result<(), GpuRuntimeError> {
        self.runtime().apply()
    }

    /// Refuses a kernel profile of a run on `devices` that names no GPU: cubecl's profiler
    /// times GPU kernels only, and the file would stay empty.
    ///
    /// # Errors
    /// [`GpuRuntimeError::NothingToProfile`].
    pub fn check(&self, devices: &[DeviceSpec]) -> Result<(), GpuRuntimeError> {
        let on_a_gpu = devices.iter().any(|d| !matches!(d, DeviceSpec::Cpu(_)));
        if self.profile_kernels.is_some() && !on_a_gpu {
            let names: Vec<String> = devices.iter().map(DeviceSpec::to_string).collect();
            return Err(GpuRuntimeError::NothingToProfile(names.join(",")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::GpuOptions;
    use crate::DeviceSpec;

    #[test]
    fn a_kernel_profile_needs_a_gpu_among_the_devices() {
        let profiled = GpuOptions {
            profile_kernels: Some("k.txt".into()),
            ..GpuOptions::default()
        };
        let cpus = DeviceSpec::parse_list("cpu:0,cpu:1").unwrap();
        let with_a_gpu = DeviceSpec::parse_list("cpu:0,cuda:0").unwrap();
        let err = profiled.check(&cpus).unwrap_err().to_string();
        assert!(
            err.contains("--profile-kernels") && err.contains("cpu:0,cpu:1"),
            "{err}"
        );
        assert!(profiled.check(&with_a_gpu).is_ok());
        assert!(GpuOptions::default().check(&cpus).is_ok());
        assert_eq!(profiled.runtime().kernel_profile, profiled.profile_kernels);
    }

    #[cfg(feature = "clap")]
    #[test]
    fn the_options_parse_as_flags_with_their_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            gpu: GpuOptions,
        }
        let parsed = Command::parse_from(["x"]).gpu;
        assert_eq!(parsed, GpuOptions::default());
        let parsed = Command::parse_from(["x", "--gpu-cache", "off", "--profile-warmup", "5"]).gpu;
        assert_eq!(parsed.gpu_cache, crate::gpu_runtime::GpuCache::Off);
        assert_eq!(parsed.profile_warmup, 5);
    }
}
