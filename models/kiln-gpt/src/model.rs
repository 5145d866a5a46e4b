//! The language model and its segments.

use burn::module::{Module, ModuleVisitor};
use burn::nn::{Dropout, Embedding, LayerNorm, Linear};
use burn::tensor::{Int, Tensor};
use kiln_core::{Forward, SegmentId, Segmented, forward_segments};

use crate::Block;

/// A decoder-only transformer; see the crate docs and [`GptConfig`](crate::GptConfig).
#[derive(Module, Debug)]
pub struct Gpt {
    /// Token embeddings `[vocabulary, width]`; the tied head reads them too.
    pub token: Embedding,
    /// Learned position embeddings `[context, width]`.
    pub position: Embedding,
    /// After the embeddings.
    pub dropout: Dropout,
    /// The transformer blocks.
    pub blocks: Vec<Block>,
    /// The final layer norm.
    pub norm: LayerNorm,
    /// The output head when untied (`None`: the token embedding, transposed).
    pub head: Option<Linear>,
}

impl Gpt {
    /// Whether the output head is the token embedding.
    pub fn is_tied(&self) -> bool {
        self.head.is_none()
    }

    /// The longest sequence it takes.
    pub fn context(&self) -> usize {
        self.position.weight.dims()[0]
    }
}

impl Segmented for Gpt {
    /// Token ids `[batch, time]`.
    type Input = Tensor<2, Int>;
    /// The residual stream `[batch, time, width]`.
    type Hidden = Tensor<3>;
    /// Logits `[batch, time, vocabulary]`.
    type Output = Tensor<3>;

    fn num_middle_segments(&self) -> usize {
        self.blocks.len()
    }

    /// # Panics
    /// If the sequence is longer than the context (a caller's error: the data path cuts
    /// windows of the context's length).
    fn forward_input(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let [batch, time] = tokens.dims();
        assert!(
            time <= self.context(),
            "a sequence of {time} tokens is longer than the model's context of {}",
            self.context()
        );
        let device = tokens.device();
        let positions = Tensor::<1, Int>::arange(0..time as i64, &device)
            .reshape([1, time])
            .expand([batch, time]);
        let x = self.token.forward(tokens) + self.position.forward(positions);
        self.dropout.forward(x)
    }

    fn forward_middle(&self, index: usize, hidden: Tensor<3>) -> Tensor<3> {
        self.blocks[index].forward(hidden)
    }

    fn forward_output(&self, hidden: Tensor<3>) -> Tensor<3> {
        let x = crate::block::normed(&self.norm, hidden);
        match &self.head {
            Some(head) => head.forward(x),
            None => {
                // The tied head: logits = x · Eᵀ, E the token embedding.
                let [batch, time, width] = x.dims();
                let weight = self.token.weight.val();
                let vocabulary = weight.dims()[0];
                x.reshape([batch * time, width])
                    .matmul(weight.transpose())
                    .reshape([batch, time, vocabulary])
            }
        }
    }

    /// The tied head reads the input segment's token embedding: `(Input, Output)`.
    fn tied_segments(&self) -> Vec<(SegmentId, SegmentId)> {
        if self.is_tied() {
            vec![(SegmentId::Input, SegmentId::Output)]
        } else {
            Vec::new()
        }
    }

    /// The token embedding belongs to the input segment (the tied head reads it from there:
    /// [`tied_segments`](Segmented::tied_segments) says so).
    fn visit_segment<V: ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V) {
        match segment {
            SegmentId::Input => {
                self.token.visit(visitor);
                self.position.visit(visitor);
            }
            SegmentId::Middle(index) => self.blocks[index].visit(visitor),
            SegmentId::Output => {
                self.norm.visit(visitor);
                if let Some(head) = &self.head {
                    head.visit(visitor);
                }
            }
        }
    }
}

impl Forward for Gpt {
    type Input = Tensor<2, Int>;
    type Output = Tensor<3>;

    fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        forward_segments(self, tokens)
    }
}
