//! A batch of token windows and their next tokens.

use std::ops::Range;

use burn::tensor::{Device, Int, Tensor};

use crate::Batch;

/// Windows of token ids and, for each position, the token that follows it.
#[derive(Debug, Clone)]
pub struct TokenBatch {
    /// `[windows, context]`.
    pub tokens: Tensor<2, Int>,
    /// `[windows, context]`: `targets[w][t]` is the token after `tokens[w][t]`.
    pub targets: Tensor<2, Int>,
}

impl Batch for TokenBatch {
    /// Windows (sequences), not tokens.
    fn samples(&self) -> usize {
        self.tokens.dims()[0]
    }

    fn slice(&self, range: Range<usize>) -> Self {
        TokenBatch {
            tokens: self.tokens.clone().slice([range.clone()]),
            targets: self.targets.clone().slice([range]),
        }
    }

    fn to_device(&self, device: &Device) -> Option<Self> {
        Some(TokenBatch {
            tokens: self.tokens.clone().to_device(device),
            targets: self.targets.clone().to_device(device),
        })
    }
}
