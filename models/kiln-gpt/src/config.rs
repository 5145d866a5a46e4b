//! The model's shape, from a test-sized one to GPT-2 small's.

use burn::config::Config;
use burn::nn::attention::MultiHeadAttentionConfig;
use burn::nn::{DropoutConfig, EmbeddingConfig, Initializer, LayerNormConfig, LinearConfig};
use burn::tensor::Device;

use crate::{Block, Gpt, NORM_EPSILON};

/// The shape of a [`Gpt`]; [`init`](Self::init) builds it.
#[derive(Config, Debug, PartialEq)]
pub struct GptConfig {
    /// Token ids are `0..vocab_size` (256 for bytes; GPT-2's BPE: 50,257).
    pub vocab_size: usize,
    /// The longest sequence (learned positions).
    pub context: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block (`width` must be a multiple).
    pub heads: usize,
    /// The model's width (embedding size).
    pub width: usize,
    /// The MLP's hidden size over the width.
    #[config(default = 4)]
    pub mlp_ratio: usize,
    /// Dropout after the embeddings, on the attention weights, and after each residual
    /// branch (0 in every equivalence test).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// The output head is the token embedding transposed (GPT-2's tie); untied, it is a
    /// matrix of its own.
    #[config(default = true)]
    pub tied: bool,
}

impl GptConfig {
    /// GPT-2 small: 12 layers, 12 heads, 768 wide, context 1024, BPE vocabulary of 50,257,
    /// tied: 124,439,808 parameters.
    pub fn gpt2_small() -> Self {
        Self::new(50_257, 1024, 12, 12, 768)
    }

    /// The parameters of the model this builds, by the closed formula: embeddings
    /// `(V + C)·W`, per block `12·W² + 13·W` (two layer norms, four attention projections
    /// with biases, the MLP's two layers with biases at ratio 4; `2·r·W² + (r + 1)·W` for the
    /// MLP at ratio r), the final norm `2·W`, and an untied head `W·V` (no bias).
    pub fn param_count(&self) -> usize {
        let (v, c, w, r) = (self.vocab_size, self.context, self.width, self.mlp_ratio);
        let norms = 2 * 2 * w;
        let attention = 4 * (w * w + w);
        let mlp = 2 * r * w * w + r * w + w;
        let head = if self.tied { 0 } else { w * v };
        (v + c) * w + self.layers * (norms + attention + mlp) + 2 * w + head
    }

    /// Builds the model on `device` (under `kiln_core::init_module`: Burn initialises lazily).
    /// Weights start as GPT-2's: normal with standard deviation 0.02, biases zero.
    ///
    /// # Panics
    /// If `width` is not a multiple of `heads`, or a size is zero (a programmer's error in
    /// the configuration).
    pub fn init(&self, device: &Device) -> Gpt {
        assert!(
            self.vocab_size > 0 && self.context > 0 && self.heads > 0 && self.width > 0,
            "every size of a GptConfig must be positive: {self:?}"
        );
        assert!(
            self.width.is_multiple_of(self.heads),
            "the width {} is not a multiple of the {} heads",
            self.width,
            self.heads
        );
        let normal = Initializer::Normal {
            mean: 0.0,
            std: 0.02,
        };
        let linear = |inputs: usize, outputs: usize| {
            LinearConfig::new(inputs, outputs)
                .with_initializer(normal.clone())
                .init(device)
        };
        let hidden = self.mlp_ratio * self.width;
        let blocks = (0..self.layers)
            .map(|_| Block {
                norm_attention: LayerNormConfig::new(self.width)
                    .with_epsilon(NORM_EPSILON)
                    .init(device),
                attention: MultiHeadAttentionConfig::new(self.width, self.heads)
                    .with_dropout(self.dropout)
                    .with_initializer(normal.clone())
                    .init(device),
                norm_mlp: LayerNormConfig::new(self.width)
                    .with_epsilon(NORM_EPSILON)
                    .init(device),
                expand: linear(self.width, hidden),
                contract: linear(hidden, self.width),
                dropout: DropoutConfig::new(self.dropout).init(),
            })
            .collect();
        let embedding = |count: usize| {
            EmbeddingConfig::new(count, self.width)
                .with_initializer(normal.clone())
                .init(device)
        };
        Gpt {
            token: embedding(self.vocab_size),
            position: embedding(self.context),
            dropout: DropoutConfig::new(self.dropout).init(),
            blocks,
            norm: LayerNormConfig::new(self.width)
                .with_epsilon(NORM_EPSILON)
                .init(device),
            head: (!self.tied).then(|| {
                LinearConfig::new(self.width, self.vocab_size)
                    .with_bias(false)
                    .with_initializer(normal)
                    .init(device)
            }),
        }
    }
}
