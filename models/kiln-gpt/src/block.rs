//! One transformer block: pre-norm causal self-attention, then a pre-norm GELU MLP, each
//! added to the residual stream.

use burn::module::Module;
use burn::nn::attention::{MhaInput, MultiHeadAttention, generate_autoregressive_mask};
use burn::nn::{Dropout, LayerNorm, Linear};
use burn::tensor::Tensor;
use burn::tensor::activation::gelu;

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
        let [batch, time, _] = x.dims();
        let mask = generate_autoregressive_mask(batch, time, &x.device());
        let attended = self
            .attention
            .forward(MhaInput::self_attn(normed(&self.norm_attention, x.clone())).mask_attn(mask))
            .context;
        let x = x + self.dropout.forward(attended);
        let hidden = gelu(self.expand.forward(normed(&self.norm_mlp, x.clone())));
        x.clone() + self.dropout.forward(self.contract.forward(hidden))
    }
}

/// `norm` on `x` in the precision of the norm's parameters, the result back in `x`'s. Under
/// mixed precision kiln's default policy keeps every `*norm*` parameter in f32 (as PyTorch's
/// autocast runs layer norm in f32), while the activations are f16/bf16: Burn refuses a
/// binary op between the two, so the cast is explicit.
pub(crate) fn normed(norm: &LayerNorm, x: Tensor<3>) -> Tensor<3> {
    let (activations, parameters) = (x.dtype(), norm.gamma.val().dtype());
    if activations == parameters {
        norm.forward(x)
    } else {
        norm.forward(x.cast(parameters)).cast(activations)
    }
}
