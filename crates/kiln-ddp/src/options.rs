//! The data-parallel options of a training command — compression, local SGD, overlap,
//! buckets, the gradient path, synchronised batch norm, ZeRO-1 — checked together and turned
//! into a [`DdpConfig`] and a replica's step. With the `clap` feature they flatten into a
//! command line: `#[command(flatten)] ddp: DdpOptions`.

use kiln_core::{Forward, Segmented};
use kiln_train::{Objective, StepOptions};

use crate::{Compression, DdpConfig, DdpError, DdpStep, GradientPath, Replica, SyncMode};

/// Data-parallel training's options (the field names are the flags' names).
///
/// ```
/// use kiln_ddp::{Compression, DdpConfig, DdpOptions, SyncMode};
///
/// let options = DdpOptions { compression: Compression::Bf16, local_sgd: Some(4), ..DdpOptions::default() };
/// options.check()?;
/// let config = options.config(DdpConfig::default());
/// assert_eq!(config.mode, SyncMode::LocalSgd { period: 4 });
/// assert_eq!(options.given(), ["--compression", "--local-sgd"]);
/// let both = DdpOptions { zero1: true, ..options };
/// assert!(both.check().unwrap_err().to_string().contains("--local-sgd and --zero1"));
/// # Ok::<(), kiln_ddp::DdpError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct DdpOptions {
    /// Gradient all-reduce element type.
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = Compression::None))]
    pub compression: Compression,
    /// Local SGD: average parameters every N steps instead of all-reducing gradients.
    #[cfg_attr(feature = "clap", arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub local_sgd: Option<usize>,
    /// All-reduce after the whole backward instead of overlapping it segment by segment.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_overlap: bool,
    /// Gradient bucket cap in KiB (the first bucket is capped at a quarter of it). Smaller
    /// buckets start communicating earlier during backward.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_BUCKET_KB, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub bucket_kb: usize,
    /// Where gradients wait for their all-reduce: `auto` (host buffer on CPU, device buckets
    /// on accelerators), `host`, or `device` (Burn's native NCCL all-reduce when every
    /// replica has its own CUDA device, else one host copy per bucket).
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = GradientPath::Auto))]
    pub gradient_path: GradientPath,
    /// Synchronised batch norm: normalise with the statistics of every replica's batch
    /// (exact backward; backward replays each residual block's forward once).
    #[cfg_attr(feature = "clap", arg(long))]
    pub sync_bn: bool,
    /// ZeRO-1: shard optimizer state over replicas; each updates only its share.
    #[cfg_attr(feature = "clap", arg(long))]
    pub zero1: bool,
}

/// PyTorch DDP's bucket cap, 25 MiB.
const DEFAULT_BUCKET_KB: usize = 25 * 1024;

impl Default for DdpOptions {
    /// Gradients all-reduced in f32, overlapped with backward, in 25 MiB buckets.
    fn default() -> Self {
        Self {
            compression: Compression::None,
            local_sgd: None,
            no_overlap: false,
            bucket_kb: DEFAULT_BUCKET_KB,
            gradient_path: GradientPath::Auto,
            sync_bn: false,
            zero1: false,
        }
    }
}

impl DdpOptions {
    /// The flags given away from their defaults, by name: the options only a data-parallel
    /// run honours, for a command that must refuse them under another plan.
    pub fn given(&self) -> Vec<&'static str> {
        [
            (self.compression != Compression::None, "--compression"),
            (self.local_sgd.is_some(), "--local-sgd"),
            (self.no_overlap, "--no-overlap"),
            (self.bucket_kb != DEFAULT_BUCKET_KB, "--bucket-kb"),
            (self.gradient_path != GradientPath::Auto, "--gradient-path"),
            (self.sync_bn, "--sync-bn"),
            (self.zero1, "--zero1"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }

    /// Refuses options that cannot be honoured together.
    ///
    /// # Errors
    /// [`DdpError::Config`], naming the flags.
    pub fn check(&self) -> Result<(), DdpError> {
        let refuse = |reason: &str| Err(DdpError::Config(reason.into()));
        if self.local_sgd == Some(0) || self.bucket_kb == 0 {
            return refuse("--local-sgd and --bucket-kb must be at least 1");
        }
        if self.local_sgd.is_some() && self.zero1 {
            return refuse(
                "--local-sgd and --zero1 conflict: ZeRO-1 shards the optimizer of a synchronous step",
            );
        }
        if self.local_sgd.is_some() && self.sync_bn {
            return refuse(
                "--local-sgd and --sync-bn conflict: synchronised batch norm needs replicas in step",
            );
        }
        Ok(())
    }

    /// `base` with these options written in (its precision, clipping, threads, timeout and
    /// the rest kept).
    pub fn config(&self, base: DdpConfig) -> DdpConfig {
        let bucket_bytes = self.bucket_kb << 10;
        DdpConfig {
            compression: self.compression,
            mode: match self.local_sgd {
                Some(period) => SyncMode::LocalSgd { period },
                None => SyncMode::Gradients,
            },
            zero1: self.zero1,
            bucket_cap_bytes: bucket_bytes,
            first_bucket_bytes: (bucket_bytes / 4).max(1),
            gradient_path: self.gradient_path,
            sync_batch_norm: self.sync_bn,
            ..base
        }
    }

    /// The replica's step for `objective`: overlapped with backward, or after it with
    /// `--no-overlap`.
    pub fn step_with<M, O>(&self, replica: &Replica, objective: O) -> DdpStep<M, O>
    where
        O: Objective,
        M: Segmented<Input = O::Input, Output = O::Output>
            + Forward<Input = O::Input, Output = O::Output>,
        M::Hidden: std::ops::Add<Output = M::Hidden>,
    {
        if self.no_overlap {
            replica.non_overlapped_step_with(objective)
        } else {
            replica.overlapped_step_with(objective)
        }
    }
}

impl DdpConfig {
    /// `self` with a program's step options written in: precision, clipping, the replicas'
    /// agreement check and compute threads (`--accumulation` is the trainer's:
    /// `TrainerBuilder::accumulation_steps`).
    pub fn with_steps(self, steps: &StepOptions) -> Self {
        DdpConfig {
            divergence_check_every: steps.check_every,
            threads_per_replica: steps.threads,
            precision: steps.precision(),
            max_grad_norm: steps.clip_grad_norm,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_reaches_the_config_and_is_named_when_given() {
        let options = DdpOptions {
            compression: Compression::F16,
            local_sgd: None,
            no_overlap: true,
            bucket_kb: 1024,
            gradient_path: GradientPath::Host,
            sync_bn: true,
            zero1: true,
        };
        options.check().unwrap();
        let base = DdpConfig {
            max_grad_norm: Some(1.0),
            ..DdpConfig::default()
        };
        let config = options.config(base.clone());
        assert_eq!(config.compression, Compression::F16);
        assert_eq!(config.mode, SyncMode::Gradients);
        assert!(config.zero1 && config.sync_batch_norm);
        assert_eq!(config.gradient_path, GradientPath::Host);
        assert_eq!(
            (config.bucket_cap_bytes, config.first_bucket_bytes),
            (1 << 20, 1 << 18)
        );
        assert_eq!(config.max_grad_norm, Some(1.0), "the base's fields stay");
        assert_eq!(options.given().len(), 6, "{:?}", options.given());
        assert!(DdpOptions::default().given().is_empty());
        assert_eq!(
            DdpOptions::default().config(base.clone()).compression,
            base.compression
        );
    }

    #[test]
    fn conflicting_and_empty_options_are_refused_by_flag() {
        let local = DdpOptions {
            local_sgd: Some(2),
            ..DdpOptions::default()
        };
        local.check().unwrap();
        for (options, flags) in [
            (
                DdpOptions {
                    zero1: true,
                    ..local.clone()
                },
                "--local-sgd and --zero1",
            ),
            (
                DdpOptions {
                    sync_bn: true,
                    ..local.clone()
                },
                "--local-sgd and --sync-bn",
            ),
            (
                DdpOptions {
                    bucket_kb: 0,
                    ..DdpOptions::default()
                },
                "--bucket-kb",
            ),
        ] {
            let err = options.check().unwrap_err().to_string();
            assert!(err.contains(flags), "{err}");
        }
    }

    #[cfg(feature = "clap")]
    #[test]
    fn the_flags_parse_into_the_options() {
        use clap::Parser;
        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            ddp: DdpOptions,
        }
        let parsed = Command::try_parse_from([
            "x",
            "--compression",
            "bf16",
            "--local-sgd",
            "3",
            "--bucket-kb",
            "64",
            "--no-overlap",
        ])
        .unwrap()
        .ddp;
        assert_eq!(parsed.compression, Compression::Bf16);
        assert_eq!((parsed.local_sgd, parsed.bucket_kb), (Some(3), 64));
        assert!(parsed.no_overlap);
        assert_eq!(
            Command::try_parse_from(["x"]).unwrap().ddp,
            DdpOptions::default()
        );
        assert!(Command::try_parse_from(["x", "--local-sgd", "0"]).is_err());
    }
}
