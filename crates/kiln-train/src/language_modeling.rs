//! Next-token prediction: the objective of a language model over [`TokenBatch`]es.

use burn::tensor::{Int, Tensor};
use kiln_data::TokenBatch;

use crate::{Objective, Reporting, classification_loss};

/// Language modelling: the mean cross-entropy, over every position of every window, of the
/// logits `[windows, time, vocabulary]` against the next tokens; its exponential is the
/// perplexity. A model takes the window's token ids (`Tensor<2, Int>`: mixed precision
/// leaves them as they are and casts the logits).
///
/// It counts no samples as right (`correct` is 0): a window is not right or wrong, and the
/// reports' accuracy is per sample; the loss is the measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LanguageModeling;

impl Objective for LanguageModeling {
    type Batch = TokenBatch;
    type Input = Tensor<2, Int>;
    type Output = Tensor<3>;

    fn input(&self, batch: &TokenBatch) -> Tensor<2, Int> {
        batch.tokens.clone()
    }

    fn loss(&self, logits: &Tensor<3>, batch: &TokenBatch) -> Tensor<1> {
        let [windows, time, vocabulary] = logits.dims();
        classification_loss(
            logits.clone().reshape([windows * time, vocabulary]),
            batch.targets.clone().reshape([windows * time]),
        )
    }

    /// Windows, without accuracy.
    fn reporting(&self) -> Reporting {
        Reporting {
            sample: "windows",
            accuracy: false,
        }
    }
}
