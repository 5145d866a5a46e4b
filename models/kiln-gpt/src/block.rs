//! One transformer block: pre-norm causal self-attention, then a pre-norm GELU MLP, each
//! added to the residual stream.

use burn::module::Module;
use burn::nn::attention::{MhaInput, MultiHeadAttention, generate_autoregressive_mask};
use burn::nn::{Dropout, LayerNorm, Linear};
use burn::tensor::Tensor;
use kiln_kernels::{causal_attention, gelu, layer_norm};

/// `x + attention(norm(x))`, then `x + mlp(norm(x))`; shapes `[batch, time, width]`.
#[derive(Module, Debug)]
pub struct Block {
    /// The norm ahead of attention.
    pub norm_attention: LayerNorm,
    /// Causal multi-head self-attention.
    pub attention: MultiHeadAttention,
    /// The norm ahead of the MLP.
    pub norm_mlp: LayerNorm,
    /// The MLP's first layer (width → ratio × width).
    pub expand: Linear,
    /// The MLP's second layer (back to the width).
    pub contract: Linear,
    /// On each residual branch.
    pub dropout: Dropout,
}

impl Block {
    /// The block on `x` (`[batch, time, width]`): each position attends to itself and the
    /// positions before it only.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let attended = self.attend(normed(&self.norm_attention, x.clone()));
        let x = x + self.dropout.forward(attended);
        let hidden = gelu(rows(&self.expand, normed(&self.norm_mlp, x.clone())));
        x.clone() + self.dropout.forward(rows(&self.contract, hidden))
    }

    /// Causal self-attention of the normed stream: the projections as whole-batch matrix
    /// products, the heads by `kiln_kernels::causal_attention` (kiln's fused kernel on the
    /// CPU). Dropout on the attention weights and the quiet softmax are outside that kernel:
    /// while dropout can act (a training device and a nonzero probability), or with a quiet
    /// softmax, Burn's multi-head attention runs instead, with the same parameters.
    fn attend(&self, x: Tensor<3>) -> Tensor<3> {
        let attention = &self.attention;
        let dropout_acts = attention.dropout.prob > 0.0 && x.device().is_autodiff();
        if dropout_acts || attention.quiet_softmax {
            let [batch, time, _] = x.dims();
            let mask = generate_autoregressive_mask(batch, time, &x.device());
            return attention
                .forward(MhaInput::self_attn(x).mask_attn(mask))
                .context;
        }
        let [query, key, value] =
            [&attention.query, &attention.key, &attention.value].map(|l| rows(l, x.clone()));
        rows(
            &attention.output,
            causal_attention(query, key, value, attention.n_heads),
        )
    }
}

/// `linear` on every position of `x` `[batch, time, in]` as one `[batch·time, in]` matrix
/// product. Burn's linear on a 3-D input multiplies per sequence against a broadcast weight
/// and sums the weight's gradient over the batch afterwards: 1.9× the time of one product
/// for the GPT's MLP layer on 2 CPU threads.
pub(crate) fn rows(linear: &Linear, x: Tensor<3>) -> Tensor<3> {
    let [batch, time, inputs] = x.dims();
    let y = linear.forward(x.reshape([batch * time, inputs]));
    let outputs = y.dims()[1];
    y.reshape([batch, time, outputs])
}

/// The epsilon of every layer norm [`GptConfig`](crate::GptConfig) builds (Burn's default).
/// Burn's `LayerNorm` keeps its epsilon private, so the blocks' norms, which run on
/// `kiln_kernels::layer_norm` (one pass on the CPU where Flex composes nine), take it from
/// here: a `Gpt` assembled by hand must build its norms with it.
pub const NORM_EPSILON: f64 = 1e-5;

/// `norm` on `x` in the precision of the norm's parameters, the result back in `x`'s. Under
/// mixed precision kiln's default policy keeps every `*norm*` parameter in f32 (as PyTorch's
/// autocast runs layer norm in f32), while the activations are f16/bf16: Burn refuses a
/// binary op between the two, so the cast is explicit.
pub(crate) fn normed(norm: &LayerNorm, x: Tensor<3>) -> Tensor<3> {
    let gamma = norm.gamma.val();
    let beta = norm.beta.as_ref().map(|b| b.val());
    let (activations, parameters) = (x.dtype(), gamma.dtype());
    if activations == parameters {
        layer_norm(x, gamma, beta, NORM_EPSILON)
    } else {
        layer_norm(x.cast(parameters), gamma, beta, NORM_EPSILON).cast(activations)
    }
}
