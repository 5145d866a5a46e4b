//! Which schedule, and what each needs of the pipeline's shape.

use std::fmt;
use std::str::FromStr;

use super::ScheduleError;

/// The family of a schedule, as `--schedule` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// All forwards, then all backwards (Huang et al. 2019; PyTorch's `ScheduleGPipe`):
    /// every stage keeps all `M` micro-batches' activations.
    GPipe,
    /// One forward, one backward (PipeDream-flush; PyTorch's `Schedule1F1B`): stage `i`
    /// keeps at most `P − i` micro-batches' activations. Needs `M ≥ P`.
    OneFOneB,
    /// Interleaved 1F1B (Narayanan et al. 2021; Megatron-LM): each device holds several
    /// model chunks, virtual stage `c·P + d` being chunk `c` of device `d`, which shrinks the
    /// bubble by the number of chunks. Needs `M` a multiple of `P`.
    Interleaved {
        /// Virtual stages (model chunks) per device, at least 2.
        virtual_stages: usize,
    },
}

impl ScheduleKind {
    /// The chunks per device this kind runs (`virtual_stages` when interleaved, else 1).
    pub fn chunks(&self) -> usize {
        match *self {
            Self::GPipe | Self::OneFOneB => 1,
            Self::Interleaved { virtual_stages } => virtual_stages,
        }
    }

    /// Checks that this kind can schedule `micro_batches` micro-batches over `stages` stages.
    pub fn check(&self, stages: usize, micro_batches: usize) -> Result<(), ScheduleError> {
        if stages == 0 {
            return Err(ScheduleError::ZeroStages);
        }
        if micro_batches == 0 {
            return Err(ScheduleError::ZeroMicroBatches);
        }
        match *self {
            Self::GPipe => Ok(()),
            Self::OneFOneB if micro_batches < stages => Err(ScheduleError::TooFewMicroBatches {
                micro_batches,
                stages,
            }),
            Self::OneFOneB => Ok(()),
            Self::Interleaved { virtual_stages } if virtual_stages < 2 => {
                Err(ScheduleError::TooFewVirtualStages { virtual_stages })
            }
            Self::Interleaved { .. } if !micro_batches.is_multiple_of(stages) => {
                Err(ScheduleError::MicroBatchesNotMultipleOfStages {
                    micro_batches,
                    stages,
                })
            }
            Self::Interleaved { .. } => Ok(()),
        }
    }
}

/// `gpipe`, `1f1b` or `interleaved:<v>`; [`FromStr`] reads it back.
impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::GPipe => f.write_str("gpipe"),
            Self::OneFOneB => f.write_str("1f1b"),
            Self::Interleaved { virtual_stages } => write!(f, "interleaved:{virtual_stages}"),
        }
    }
}

/// Reads `gpipe`, `1f1b`, `interleaved` (2 chunks per device) or `interleaved:<v>`, in any
/// case; `interleaved:<v>` with `v < 2` is refused.
impl FromStr for ScheduleKind {
    type Err = ScheduleError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let unknown = || ScheduleError::UnknownKind {
            input: input.to_string(),
        };
        let name = input.trim().to_ascii_lowercase();
        match name.as_str() {
            "gpipe" => Ok(Self::GPipe),
            "1f1b" => Ok(Self::OneFOneB),
            "interleaved" => Ok(Self::Interleaved { virtual_stages: 2 }),
            _ => {
                let count = name.strip_prefix("interleaved:").ok_or_else(unknown)?;
                let virtual_stages = count.trim().parse().map_err(|_| unknown())?;
                if virtual_stages < 2 {
                    return Err(ScheduleError::TooFewVirtualStages { virtual_stages });
                }
                Ok(Self::Interleaved { virtual_stages })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_print_round_trip() {
        for kind in [
            ScheduleKind::GPipe,
            ScheduleKind::OneFOneB,
            ScheduleKind::Interleaved { virtual_stages: 3 },
        ] {
            assert_eq!(kind.to_string().parse::<ScheduleKind>().unwrap(), kind);
        }
        assert_eq!(
            "Interleaved".parse::<ScheduleKind>().unwrap(),
            ScheduleKind::Interleaved { virtual_stages: 2 }
        );
        assert_eq!(
            " 1F1B ".parse::<ScheduleKind>().unwrap(),
            ScheduleKind::OneFOneB
        );
    }

    #[test]
    fn unknown_kinds_and_single_chunk_interleaving_are_refused() {
        let message = "pipedream".parse::<ScheduleKind>().unwrap_err().to_string();
        assert!(message.contains("\"pipedream\""), "{message}");
        assert!(message.contains("gpipe, 1f1b, interleaved"), "{message}");
        assert!("interleaved:x".parse::<ScheduleKind>().is_err());
        let message = "interleaved:1"
            .parse::<ScheduleKind>()
            .unwrap_err()
            .to_string();
        assert!(message.contains("use 1f1b"), "{message}");
    }
}
