//! How each optimizer step computes, as a program's options (`--amp`, `--clip-grad-norm`,
//! `--accumulation`, `--check-every`, `--threads`): clap arguments with the `clap` feature,
//! range-checked as they are parsed, and the parsers for a program's own counts and rates.

use kiln_amp::{MixedPrecision, Precision};

/// The step's options of a training program, the same for a data-parallel replica and a
/// pipeline stage (`DdpConfig::with_steps`, `PipelineConfig::with_steps` take them).
///
/// ```
/// use kiln_train::StepOptions;
///
/// let options = StepOptions { accumulation: 4, ..StepOptions::default() };
/// assert_eq!(options.accumulation, 4);
/// assert!(options.check().is_ok());
/// assert!(StepOptions { clip_grad_norm: Some(-1.0), ..options }.check().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct StepOptions {
    /// Compute precision: f32, or mixed precision with f16 (loss-scaled) or bf16 compute and
    /// f32 master weights; every parallel option works with it. On the CPU backend (Flex) it
    /// saves activation memory, not time: kiln's convolution and batch norm compute half inputs
    /// in f32, so a bf16 step runs at about f32's speed, and an f16 step about 1.8x slower
    /// (Flex's f16 element-wise kernels; see the README's limitations).
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = Precision::F32))]
    pub amp: Precision,
    /// Clip gradients to this global norm (over every parameter, after the all-reduce; over
    /// all shards with --zero1; a pipeline's stages agree on it), like PyTorch's
    /// `clip_grad_norm_`.
    #[cfg_attr(feature = "clap", arg(long, value_parser = positive_norm))]
    pub clip_grad_norm: Option<f32>,
    /// Batches accumulated per optimizer step (one all-reduce per step; a pipeline runs them
    /// as one schedule).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1, value_parser = positive_count))]
    pub accumulation: usize,
    /// Compare parameter fingerprints across replicas (a pipeline's stages: their copies of
    /// tied parameters) every N steps (0 = never); a mismatch stops training with an error
    /// naming the first differing parameter.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub check_every: usize,
    /// Compute threads per replica or stage (each runs Burn's CPU kernels in its own pool).
    /// Default: the machine's cores divided among this process's replicas or stages.
    #[cfg_attr(feature = "clap", arg(long, value_parser = thread_count))]
    pub threads: Option<usize>,
}

impl Default for StepOptions {
    fn default() -> Self {
        Self {
            amp: Precision::F32,
            clip_grad_norm: None,
            accumulation: 1,
            check_every: 0,
            threads: None,
        }
    }
}

impl StepOptions {
    /// The mixed precision `--amp` asks for.
    pub fn precision(&self) -> MixedPrecision {
        MixedPrecision::new(self.amp)
    }

    /// What to know about these options on `devices`: `--amp` on CPU devices only saves
    /// activation memory, not time.
    pub fn note_for(&self, devices: &[kiln_core::DeviceSpec]) -> Option<&'static str> {
        let cpu_only = devices
            .iter()
            .all(|d| matches!(d, kiln_core::DeviceSpec::Cpu(_)));
        (self.amp != Precision::F32 && cpu_only).then_some(
            "note: --amp on the CPU backend saves activation memory, not time (bf16 steps run at about f32 speed, f16 steps about 1.8x slower: Flex's f16 element-wise kernels)",
        )
    }

    /// Refuses what clap's parsers would have (for options filled by hand).
    ///
    /// # Errors
    /// The flag and why, as text.
    pub fn check(&self) -> Result<(), String> {
        if let Some(norm) = self.clip_grad_norm {
            norm_in_range(norm).map_err(|why| format!("--clip-grad-norm {why}"))?;
        }
        if self.accumulation == 0 {
            return Err("--accumulation must be at least 1".into());
        }
        if let Some(threads) = self.threads {
            threads_in_range(threads).map_err(|why| format!("--threads {why}"))?;
        }
        Ok(())
    }
}

/// A count that must be at least one (batch sizes, steps, widths, ...).
///
/// # Errors
/// Why the text is not one, for clap to show beside the flag.
pub fn positive_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(count) => Ok(count),
        Err(err) => Err(format!("not a count: {err}")),
    }
}

/// A positive, finite rate (a learning rate: NaN or infinity would fail at the first step).
///
/// # Errors
/// Why the text is not one.
pub fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        Ok(rate) => Err(format!("must be positive and finite, not {rate}")),
        Err(err) => Err(format!("not a number: {err}")),
    }
}

/// A positive, finite gradient norm.
#[cfg(any(feature = "clap", test))]
fn positive_norm(text: &str) -> Result<f32, String> {
    norm_in_range(text.parse().map_err(|err| format!("not a number: {err}"))?)
}

fn norm_in_range(norm: f32) -> Result<f32, String> {
    match norm.is_finite() && norm > 0.0 {
        true => Ok(norm),
        false => Err(format!("must be positive and finite, not {norm}")),
    }
}

/// Compute threads: at least one, at most this machine's cores (more would only contend, and
/// an absurd count spent minutes spawning threads).
#[cfg(any(feature = "clap", test))]
fn thread_count(text: &str) -> Result<usize, String> {
    threads_in_range(positive_count(text)?)
}

fn threads_in_range(count: usize) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    match count {
        0 => Err("must be at least 1".to_string()),
        count if count > cores => Err(format!(
            "{count} threads per replica, but this machine has {cores} cores"
        )),
        count => Ok(count),
    }
}

#[cfg(test)]
mod tests {
    use super::{StepOptions, positive_count, positive_norm, positive_rate, thread_count};

    #[test]
    fn the_parsers_refuse_zero_negative_and_non_finite_values() {
        assert_eq!(positive_count("3"), Ok(3));
        assert!(positive_count("0").is_err() && positive_count("x").is_err());
        assert!(positive_rate("NaN").is_err() && positive_rate("-0.1").is_err());
        assert_eq!(positive_rate("0.5"), Ok(0.5));
        assert!(positive_norm("inf").is_err() && positive_norm("0").is_err());
        assert!(thread_count("100000").unwrap_err().contains("cores"));
        assert_eq!(thread_count("1"), Ok(1));
    }

    #[test]
    fn options_filled_by_hand_are_checked_as_the_flags_would_be() {
        assert!(StepOptions::default().check().is_ok());
        let bad = |options: StepOptions| options.check().unwrap_err();
        let zero = StepOptions {
            accumulation: 0,
            ..StepOptions::default()
        };
        assert!(bad(zero).contains("--accumulation"));
        let nan = StepOptions {
            clip_grad_norm: Some(f32::NAN),
            ..StepOptions::default()
        };
        assert!(bad(nan).contains("--clip-grad-norm"));
    }

    #[test]
    fn half_precision_on_cpu_devices_only_gets_a_note() {
        let cpu = kiln_core::DeviceSpec::parse_list("cpu:0,cpu:1").unwrap();
        let gpu = kiln_core::DeviceSpec::parse_list("cpu:0,cuda:0").unwrap();
        let half = StepOptions {
            amp: kiln_amp::Precision::Bf16,
            ..StepOptions::default()
        };
        assert!(
            half.note_for(&cpu)
                .is_some_and(|note| note.contains("--amp"))
        );
        assert!(half.note_for(&gpu).is_none());
        assert!(StepOptions::default().note_for(&cpu).is_none());
    }

    #[cfg(feature = "clap")]
    #[test]
    fn the_options_parse_as_flags_with_their_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            step: StepOptions,
        }
        assert_eq!(Command::parse_from(["x"]).step, StepOptions::default());
        let parsed = Command::parse_from(["x", "--amp", "bf16", "--accumulation", "2"]).step;
        assert_eq!(
            (parsed.amp, parsed.accumulation),
            (kiln_amp::Precision::Bf16, 2)
        );
        assert!(Command::try_parse_from(["x", "--clip-grad-norm", "0"]).is_err());
    }
}
