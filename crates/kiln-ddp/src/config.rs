//! Data-parallel options.

use kiln_amp::MixedPrecision;

use crate::DdpError;

/// The element type gradients travel in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Compression {
    /// Full `f32` gradients.
    #[default]
    #[cfg_attr(feature = "clap", value(name = "f32"))]
    None,
    /// IEEE half precision (range ±65504; tiny gradients underflow).
    F16,
    /// bfloat16 (`f32`'s range, 8 bits of mantissa).
    Bf16,
}

/// How replicas keep their parameters in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// All-reduce gradients every step (synchronous SGD; replicas stay identical).
    #[default]
    Gradients,
    /// Local SGD: replicas step on their own gradients and average parameters every
    /// `period` steps.
    LocalSgd {
        /// Steps between parameter averages.
        period: usize,
    },
    /// No synchronisation at all. For measuring sync overhead only: replicas drift apart.
    Unsynchronized,
}

/// Where gradients wait for their all-reduce, and what reduces them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum GradientPath {
    /// [`Host`](Self::Host) for CPU replicas, [`Device`](Self::Device) for accelerators.
    #[default]
    Auto,
    /// Each parameter's gradient is copied into one host buffer, which the communicator
    /// reduces bucket by bucket. Best on CPU, where device memory is host memory.
    Host,
    /// Gradients stay on the device; each bucket is concatenated there. When every replica
    /// of this process has its own CUDA device (and the world is this process), buckets are
    /// all-reduced by Burn's native collective (NCCL), never leaving the GPUs and overlapping
    /// the rest of backward on NCCL's stream; otherwise (MPI, shared or non-CUDA devices)
    /// each bucket crosses to the host once for the communicator.
    Device,
}

/// Options of data-parallel training.
#[derive(Debug, Clone, PartialEq)]
pub struct DdpConfig {
    /// Cap on a gradient bucket's size in bytes of f32 gradients (default 25 MiB, like
    /// PyTorch): a bucket closes before the parameter that would take it past the cap, and a
    /// parameter larger than the cap travels in a bucket of its own.
    pub bucket_cap_bytes: usize,
    /// Cap of the first bucket, which closes early so communication starts sooner (1 MiB;
    /// same rule as `bucket_cap_bytes`).
    pub first_bucket_bytes: usize,
    /// Element type on the wire.
    pub compression: Compression,
    /// Gradient all-reduce, local SGD, or nothing.
    pub mode: SyncMode,
    /// Compare parameter checksums across replicas every this many steps (0 = never).
    pub divergence_check_every: usize,
    /// ZeRO stage 1: shard optimizer state over replicas (reduce-scatter gradients, each
    /// replica updates the parameters it owns, all-gather parameters). Synchronous mode only.
    pub zero1: bool,
    /// Timeout of every collective.
    pub timeout: std::time::Duration,
    /// Host buffer or device buckets (ZeRO-1 always stages through the host).
    pub gradient_path: GradientPath,
    /// Synchronised batch norm: layers normalised with `kiln_core::sync_batch_norm` use
    /// the statistics of every replica's batch, forward and backward (small all-reduces per
    /// layer each way). Other layers and evaluation are unaffected. Backward replays the
    /// forward of a layer's segment up to once per synchronised layer (see
    /// `kiln_core::sync_norm` and `Segmented::only_input_forks`), so use it with [`Replica::overlapped_step`](crate::Replica::overlapped_step): with
    /// [`Replica::non_overlapped_step`](crate::Replica::non_overlapped_step) the whole model is one
    /// segment and is replayed once per layer.
    pub sync_batch_norm: bool,
    /// Threads of each replica's own compute pool (Burn's CPU kernels run in it). `None`: the
    /// machine's cores divided among this process's replicas, at least one each (see
    /// [`default_threads_per_replica`](crate::default_threads_per_replica)).
    pub threads_per_replica: Option<usize>,
    /// Compute precision of forward and backward, the keep-f32 policy and the loss scaler
    /// (default: f32). Master weights, optimizer state and the gradient reduction stay f32.
    pub precision: MixedPrecision,
    /// Clip gradients to this global norm: over every parameter of the model, computed on
    /// the reduced gradients (over all ZeRO shards; under local SGD, each replica's own).
    pub max_grad_norm: Option<f32>,
    /// Train on Burn's gradient-checkpointing autodiff device
    /// ([`Replica::train_device`](crate::Replica::train_device)): memory-bound activations
    /// are recomputed in backward instead of kept (the planner's memory lever).
    pub gradient_checkpointing: bool,
}

impl DdpConfig {
    /// Checks that every option takes effect: values in range, and no option that another
    /// one would silently switch off.
    ///
    /// # Errors
    ///
    /// [`DdpError::Config`] naming the option (or the two conflicting options) and why.
    pub fn validate(&self) -> Result<(), DdpError> {
        let fail = |message: &str| Err(DdpError::Config(message.into()));
        let synchronous = self.mode == SyncMode::Gradients;
        if self.bucket_cap_bytes == 0 || self.first_bucket_bytes == 0 {
            return fail("bucket_cap_bytes and first_bucket_bytes must be at least 1 byte");
        }
        if self.mode == (SyncMode::LocalSgd { period: 0 }) {
            return fail("local SGD's period must be at least 1 step");
        }
        if self.timeout.is_zero() {
            return fail("timeout must be longer than zero");
        }
        if self.threads_per_replica == Some(0) {
            return fail(
                "threads_per_replica must be at least 1 (None: the cores divided among replicas)",
            );
        }
        if let Some(max_norm) = self.max_grad_norm
            && !(max_norm.is_finite() && max_norm > 0.0)
        {
            return Err(DdpError::Config(format!(
                "max_grad_norm must be positive and finite, not {max_norm}"
            )));
        }
        if self.zero1 && !synchronous {
            return fail(
                "zero1 needs SyncMode::Gradients: ZeRO-1 shards the optimizer of a synchronous step",
            );
        }
        if self.zero1 && self.gradient_path == GradientPath::Device {
            return fail(
                "zero1 and GradientPath::Device conflict: ZeRO-1 reduce-scatters one host buffer (use Auto or Host)",
            );
        }
        if self.compression != Compression::None && !synchronous {
            return fail(
                "compression applies to the gradient all-reduce of SyncMode::Gradients only",
            );
        }
        if self.divergence_check_every > 0 && !synchronous {
            return fail(
                "divergence_check_every needs SyncMode::Gradients: other modes let replicas differ by design",
            );
        }
        Ok(())
    }
}

impl Default for DdpConfig {
    fn default() -> Self {
        Self {
            bucket_cap_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            compression: Compression::None,
            mode: SyncMode::Gradients,
            divergence_check_every: 0,
            zero1: false,
            timeout: kiln_comm::DEFAULT_TIMEOUT,
            gradient_path: GradientPath::Auto,
            sync_batch_norm: false,
            threads_per_replica: None,
            precision: MixedPrecision::f32(),
            max_grad_norm: None,
            gradient_checkpointing: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_conflict_is_refused_and_names_its_options() {
        let base = DdpConfig::default;
        let local_sgd = SyncMode::LocalSgd { period: 2 };
        let refused = [
            (
                DdpConfig {
                    bucket_cap_bytes: 0,
                    ..base()
                },
                "bucket_cap_bytes",
            ),
            (
                DdpConfig {
                    mode: SyncMode::LocalSgd { period: 0 },
                    ..base()
                },
                "period",
            ),
            (
                DdpConfig {
                    timeout: std::time::Duration::ZERO,
                    ..base()
                },
                "timeout",
            ),
            (
                DdpConfig {
                    threads_per_replica: Some(0),
                    ..base()
                },
                "threads_per_replica",
            ),
            (
                DdpConfig {
                    max_grad_norm: Some(0.0),
                    ..base()
                },
                "max_grad_norm",
            ),
            (
                DdpConfig {
                    zero1: true,
                    mode: local_sgd,
                    ..base()
                },
                "zero1",
            ),
            (
                DdpConfig {
                    zero1: true,
                    gradient_path: GradientPath::Device,
                    ..base()
                },
                "GradientPath::Device",
            ),
            (
                DdpConfig {
                    compression: Compression::Bf16,
                    mode: SyncMode::Unsynchronized,
                    ..base()
                },
                "compression",
            ),
            (
                DdpConfig {
                    divergence_check_every: 3,
                    mode: local_sgd,
                    ..base()
                },
                "divergence_check_every",
            ),
        ];
        for (config, names) in refused {
            let message = config.validate().expect_err("refused").to_string();
            assert!(message.contains(names), "{config:?}: {message}");
        }
        let accepted = [
            base(),
            DdpConfig {
                zero1: true,
                compression: Compression::F16,
                divergence_check_every: 5,
                threads_per_replica: Some(3),
                ..base()
            },
            DdpConfig {
                mode: local_sgd,
                sync_batch_norm: true,
                ..base()
            },
        ];
        for config in accepted {
            assert!(config.validate().is_ok(), "{config:?}");
        }
    }

    #[test]
    fn a_run_with_a_conflicting_configuration_fails_before_training() {
        let result = crate::DataParallel::new(vec![burn::tensor::Device::flex()])
            .config(DdpConfig {
                zero1: true,
                mode: SyncMode::Unsynchronized,
                ..DdpConfig::default()
            })
            .run(|_| -> Result<(), kiln_train::TrainError> { panic!("training must not start") });
        assert!(matches!(result, Err(DdpError::Config(_))), "{result:?}");
    }
}
