//! Settings of the GPU backends' runtime (CubeCL) that a process fixes once, before it first
//! uses a GPU: where compiled kernels and autotune results are cached on disk, how hard
//! autotune searches, and a per-kernel profile.
//!
//! Why kiln sets them: without an on-disk cache every process compiles and tunes every kernel
//! again (1–2 minutes on an H200 before ResNet-18's first step). cubecl's default keeps only
//! autotune results; [`GpuRuntime::apply`] also keeps the compiled kernels, so a second process
//! starts in seconds.
//!
//! Where the cache lives by default (cubecl's rule): `target/environment/` of the outermost
//! cargo workspace above the current directory, else the user cache (`~/.cache/cubecl` on
//! Linux). One database file (`default.db`, turso); several processes may share it: writers
//! take the database's write lock in turn (5 s busy timeout), the first value written for a
//! key wins, and a process that cannot open or write it keeps its results in memory and
//! computes them again next time, never fails. A `cubecl.toml` and cubecl's `CUBECL_*`
//! variables are read first; what is set here overrides them.

use std::path::PathBuf;

/// How hard autotune searches on a kernel's first use with a new shape (cubecl's levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutotuneLevel {
    /// Fewest candidates: the quickest first run, possibly slower kernels.
    Minimal,
    /// cubecl's default.
    #[default]
    Balanced,
    /// More candidates.
    Extensive,
    /// Every candidate: the slowest first run.
    Full,
}

impl std::str::FromStr for AutotuneLevel {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "minimal" => Ok(Self::Minimal),
            "balanced" => Ok(Self::Balanced),
            "extensive" => Ok(Self::Extensive),
            "full" => Ok(Self::Full),
            other => Err(format!(
                "autotune level `{other}`: expected minimal, balanced, extensive or full"
            )),
        }
    }
}

/// Where compiled kernels and autotune results are kept between processes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuCache {
    /// cubecl's place (see the module's documentation).
    #[default]
    Default,
    /// This directory (created if missing).
    Directory(PathBuf),
    /// Nowhere: every process compiles and tunes again.
    Off,
}

impl std::str::FromStr for GpuCache {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "" => Err("--gpu-cache: expected a directory, `default` or `off`".into()),
            "default" => Ok(Self::Default),
            "off" => Ok(Self::Off),
            dir => Ok(Self::Directory(PathBuf::from(dir))),
        }
    }
}

/// Why the GPU runtime's settings could not be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GpuRuntimeError {
    /// A setting was asked for in a build without a GPU backend.
    #[error("{0} needs kiln built with `--features cuda` or `--features wgpu`")]
    NoGpuBackend(&'static str),
    /// A setting the GPU backend of a `wgpu-bare` build lacks (it has no autotune and no
    /// kernel cache).
    #[error(
        "{0} needs kiln built with `--features wgpu` (or `cuda`): this build has `wgpu-bare`, \
         Burn's wgpu backend without autotune, fusion and the kernel cache"
    )]
    BareBackend(&'static str),
    /// A kernel profile asked of a run on CPU devices only (these).
    #[error(
        "--profile-kernels times GPU kernels, and --devices {0} names none (CPU devices run \
         Burn's and kiln's CPU kernels, which cubecl's profiler does not see)"
    )]
    NothingToProfile(String),
    /// The runtime had already read its settings (a GPU was used before).
    #[error("the GPU runtime's settings were already fixed: apply them before the first GPU use")]
    AlreadyFixed,
    /// The cache directory cannot be made.
    #[error("GPU cache directory {path}: {why}")]
    CacheDirectory {
        /// The directory.
        path: PathBuf,
        /// What failed.
        why: String,
    },
}

/// The GPU runtime's settings for this process.
///
/// ```
/// use kiln_core::gpu_runtime::{AutotuneLevel, GpuCache, GpuRuntime};
///
/// let runtime = GpuRuntime {
///     autotune: Some(AutotuneLevel::Minimal),
///     ..GpuRuntime::default()
/// };
/// # #[cfg(not(any(feature = "cuda", feature = "wgpu-bare")))]
/// # assert!(runtime.apply().is_err()); // asked for, but this build has no GPU backend
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuRuntime {
    /// Where compiled kernels and tuning results are cached.
    pub cache: GpuCache,
    /// Autotune's level; `None`: cubecl's configuration (its default, `balanced`).
    pub autotune: Option<AutotuneLevel>,
    /// Append every kernel's name and GPU time to this file, as it runs (cubecl's profiling
    /// logger: kernels are timed one by one, so a profiled run is slower).
    pub kernel_profile: Option<PathBuf>,
}

impl GpuRuntime {
    /// What was asked for beyond cubecl's own defaults (apart from kiln's kernel cache).
    #[cfg(not(any(feature = "cuda", feature = "wgpu-bare")))]
    fn asks_for_something(&self) -> Option<&'static str> {
        if self.cache != GpuCache::Default {
            Some("a GPU cache setting")
        } else if self.autotune.is_some() {
            Some("an autotune level")
        } else if self.kernel_profile.is_some() {
            Some("a kernel profile")
        } else {
            None
        }
    }

    /// Fixes these settings for the process. Call it before any GPU device is used; in a
    /// build without a GPU backend it does nothing, unless a setting was asked for (then an
    /// error says so: no setting is silently ignored).
    pub fn apply(&self) -> Result<(), GpuRuntimeError> {
        #[cfg(all(feature = "wgpu-bare", not(any(feature = "cuda", feature = "wgpu"))))]
        if matches!(self.cache, GpuCache::Directory(_)) {
            return Err(GpuRuntimeError::BareBackend("a GPU cache directory"));
        } else if self.autotune.is_some() {
            return Err(GpuRuntimeError::BareBackend("an autotune level"));
        }
        if let GpuCache::Directory(path) = &self.cache {
            std::fs::create_dir_all(path).map_err(|err| GpuRuntimeError::CacheDirectory {
                path: path.clone(),
                why: err.to_string(),
            })?;
        }
        self.apply_to_backend()
    }

    #[cfg(not(any(feature = "cuda", feature = "wgpu-bare")))]
    fn apply_to_backend(&self) -> Result<(), GpuRuntimeError> {
        match self.asks_for_something() {
            Some(what) => Err(GpuRuntimeError::NoGpuBackend(what)),
            None => Ok(()),
        }
    }

    #[cfg(any(feature = "cuda", feature = "wgpu-bare"))]
    fn apply_to_backend(&self) -> Result<(), GpuRuntimeError> {
        use cubecl_runtime::config::autotune::AutotuneLevel as Level;
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        use cubecl_runtime::config::cache::CacheConfig;
        use cubecl_runtime::config::profiling::ProfilingLogLevel;
        use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

        // A user's cubecl.toml and CUBECL_* variables first, then what kiln was asked for.
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        // A `wgpu-bare` build has no cache to turn on or off (`apply` refused a directory).
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        match &self.cache {
            GpuCache::Default => config.compilation.cache = true,
            GpuCache::Directory(path) => {
                config.compilation.cache = true;
                config.environment.path = CacheConfig::Directory(path.clone());
            }
            GpuCache::Off => {
                config.compilation.cache = false;
                config.autotune.disable_cache = true;
                config.throughput.disable_cache = true;
            }
        }
        if let Some(level) = self.autotune {
            config.autotune.level = match level {
                AutotuneLevel::Minimal => Level::Minimal,
                AutotuneLevel::Balanced => Level::Balanced,
                AutotuneLevel::Extensive => Level::Extensive,
                AutotuneLevel::Full => Level::Full,
            };
        }
        if let Some(file) = &self.kernel_profile {
            config.profiling.logger.level = ProfilingLogLevel::Basic;
            config.profiling.logger.file = Some(file.clone());
            config.profiling.logger.append = true;
        }
        if CubeClRuntimeConfig::try_set(config) {
            Ok(())
        } else {
            Err(GpuRuntimeError::AlreadyFixed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_nonsense_is_refused() {
        assert_eq!("minimal".parse(), Ok(AutotuneLevel::Minimal));
        assert_eq!("full".parse(), Ok(AutotuneLevel::Full));
        assert!("fast".parse::<AutotuneLevel>().is_err());
        assert_eq!("off".parse(), Ok(GpuCache::Off));
        assert_eq!("default".parse(), Ok(GpuCache::Default));
        assert_eq!(
            "/tmp/k".parse(),
            Ok(GpuCache::Directory(PathBuf::from("/tmp/k")))
        );
        assert!("".parse::<GpuCache>().is_err());
    }

    #[cfg(not(any(feature = "cuda", feature = "wgpu-bare")))]
    #[test]
    fn a_cpu_build_refuses_gpu_settings_instead_of_ignoring_them() {
        assert_eq!(GpuRuntime::default().apply(), Ok(()));
        let asked = GpuRuntime {
            autotune: Some(AutotuneLevel::Minimal),
            ..GpuRuntime::default()
        };
        assert_eq!(
            asked.apply(),
            Err(GpuRuntimeError::NoGpuBackend("an autotune level"))
        );
    }
}
