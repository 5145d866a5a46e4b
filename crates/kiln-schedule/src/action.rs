//! One step of one stage's program.

use std::fmt;

/// One step in a stage's (a device's) list of work for a training step.
///
/// `micro` is the micro-batch, `chunk` the model chunk *on the stage running the action*
/// (always 0 without interleaving; virtual stage `chunk * P + stage`), and `to`/`from` the
/// peer stage (device index). A send and its receive each name their own stage's chunk: the
/// activation of virtual stage `s` is received by virtual stage `s + 1`, the input gradient of
/// `s` by `s − 1`. Hand-overs between two chunks of the same stage are not sends: the runtime
/// passes the tensor directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Runs the forward pass of `chunk` on micro-batch `micro`.
    Forward {
        /// The micro-batch.
        micro: usize,
        /// The model chunk on this stage.
        chunk: usize,
    },
    /// Runs the backward pass of `chunk` on micro-batch `micro` (on the last virtual stage,
    /// starting from the loss).
    Backward {
        /// The micro-batch.
        micro: usize,
        /// The model chunk on this stage.
        chunk: usize,
    },
    /// Sends the activation `chunk` produced for `micro` to stage `to` (non-blocking).
    SendActivation {
        /// The micro-batch.
        micro: usize,
        /// The chunk on this stage that produced the activation.
        chunk: usize,
        /// The stage holding the next virtual stage.
        to: usize,
    },
    /// Waits for the input activation of `chunk` for `micro`, sent by stage `from`.
    RecvActivation {
        /// The micro-batch.
        micro: usize,
        /// The chunk on this stage that consumes the activation.
        chunk: usize,
        /// The stage holding the previous virtual stage.
        from: usize,
    },
    /// Sends the input gradient `chunk` computed for `micro` to stage `to` (non-blocking).
    SendGradient {
        /// The micro-batch.
        micro: usize,
        /// The chunk on this stage whose backward produced the gradient.
        chunk: usize,
        /// The stage holding the previous virtual stage.
        to: usize,
    },
    /// Waits for the output gradient of `chunk` for `micro`, sent by stage `from`.
    RecvGradient {
        /// The micro-batch.
        micro: usize,
        /// The chunk on this stage that consumes the gradient.
        chunk: usize,
        /// The stage holding the next virtual stage.
        from: usize,
    },
    /// All-reduces this stage's gradients over its data-parallel replicas (a no-op without
    /// data parallelism).
    ReduceGradients,
    /// Applies the optimizer to this stage's parameters.
    OptimizerStep,
}

impl Action {
    /// The micro-batch this action works on (`None` for the end-of-step actions).
    pub fn micro(&self) -> Option<usize> {
        match *self {
            Self::Forward { micro, .. }
            | Self::Backward { micro, .. }
            | Self::SendActivation { micro, .. }
            | Self::RecvActivation { micro, .. }
            | Self::SendGradient { micro, .. }
            | Self::RecvGradient { micro, .. } => Some(micro),
            Self::ReduceGradients | Self::OptimizerStep => None,
        }
    }

    /// The chunk (on this stage) this action works on (`None` for the end-of-step actions).
    pub fn chunk(&self) -> Option<usize> {
        match *self {
            Self::Forward { chunk, .. }
            | Self::Backward { chunk, .. }
            | Self::SendActivation { chunk, .. }
            | Self::RecvActivation { chunk, .. }
            | Self::SendGradient { chunk, .. }
            | Self::RecvGradient { chunk, .. } => Some(chunk),
            Self::ReduceGradients | Self::OptimizerStep => None,
        }
    }

    /// The other stage of a send (`to`) or receive (`from`); `None` for other actions.
    pub fn peer(&self) -> Option<usize> {
        match *self {
            Self::SendActivation { to, .. } | Self::SendGradient { to, .. } => Some(to),
            Self::RecvActivation { from, .. } | Self::RecvGradient { from, .. } => Some(from),
            _ => None,
        }
    }

    /// Whether this is a forward or backward pass (the only actions that take compute time).
    pub fn is_compute(&self) -> bool {
        matches!(self, Self::Forward { .. } | Self::Backward { .. })
    }
}

/// Writes ` (chunk c)` for chunks other than 0, so single-chunk schedules read plainly.
fn chunk_suffix(chunk: usize) -> String {
    if chunk == 0 {
        String::new()
    } else {
        format!(" (chunk {chunk})")
    }
}

/// In words, as error messages name it: `recv activation of micro-batch 3 from stage 0`
/// (chunk 0 is not named; other chunks are, as in `forward of micro-batch 3 (chunk 1)`).
impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Forward { micro, chunk } => {
                write!(f, "forward of micro-batch {micro}{}", chunk_suffix(chunk))
            }
            Self::Backward { micro, chunk } => {
                write!(f, "backward of micro-batch {micro}{}", chunk_suffix(chunk))
            }
            Self::SendActivation { micro, chunk, to } => write!(
                f,
                "send activation of micro-batch {micro}{} to stage {to}",
                chunk_suffix(chunk)
            ),
            Self::RecvActivation { micro, chunk, from } => write!(
                f,
                "recv activation of micro-batch {micro}{} from stage {from}",
                chunk_suffix(chunk)
            ),
            Self::SendGradient { micro, chunk, to } => write!(
                f,
                "send gradient of micro-batch {micro}{} to stage {to}",
                chunk_suffix(chunk)
            ),
            Self::RecvGradient { micro, chunk, from } => write!(
                f,
                "recv gradient of micro-batch {micro}{} from stage {from}",
                chunk_suffix(chunk)
            ),
            Self::ReduceGradients => f.write_str("reduce gradients"),
            Self::OptimizerStep => f.write_str("optimizer step"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_read_as_words_naming_chunks_other_than_zero() {
        let recv = Action::RecvActivation {
            micro: 3,
            chunk: 0,
            from: 0,
        };
        assert_eq!(
            recv.to_string(),
            "recv activation of micro-batch 3 from stage 0"
        );
        let forward = Action::Forward { micro: 3, chunk: 1 };
        assert_eq!(forward.to_string(), "forward of micro-batch 3 (chunk 1)");
        assert_eq!(Action::OptimizerStep.to_string(), "optimizer step");
        assert_eq!(forward.micro(), Some(3));
        assert_eq!(Action::ReduceGradients.chunk(), None);
        assert_eq!(recv.peer(), Some(0));
        assert_eq!(forward.peer(), None);
    }
}
