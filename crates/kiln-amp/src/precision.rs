//! The compute precision of a run.

use std::fmt;
use std::str::FromStr;

use burn::tensor::FloatDType;

/// The float type forward and backward run in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Precision {
    /// Full precision (AMP off).
    #[default]
    F32,
    /// IEEE half: 5 exponent bits (range ±65504), so gradients need loss scaling.
    F16,
    /// bfloat16: f32's exponent range with 8 bits of mantissa; no scaling needed.
    Bf16,
}

impl Precision {
    /// Burn's dtype for it.
    pub fn dtype(self) -> FloatDType {
        match self {
            Precision::F32 => FloatDType::F32,
            Precision::F16 => FloatDType::F16,
            Precision::Bf16 => FloatDType::BF16,
        }
    }

    /// Whether this precision needs loss scaling by default (only f16).
    pub fn needs_scaling(self) -> bool {
        self == Precision::F16
    }
}

/// A precision name that is not `f32`, `f16` or `bf16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision `{0}`: expected f32, f16 or bf16")]
pub struct PrecisionParseError(pub String);

impl FromStr for Precision {
    type Err = PrecisionParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "f32" | "fp32" => Ok(Precision::F32),
            "f16" | "fp16" => Ok(Precision::F16),
            "bf16" => Ok(Precision::Bf16),
            other => Err(PrecisionParseError(other.to_string())),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        })
    }
}
