//! AdamW as GPTs are trained with it: weight decay on the weight matrices only. Biases,
//! layer norms and the embeddings (token, position; a tied head is the token embedding) are
//! not decayed — decaying them pulls norms' scales and rare tokens' embeddings to zero for
//! no regularisation gain (GPT-2, minGPT, Megatron-LM).
//!
//! The AdamW is kiln's fused one (`kiln_kernels::FusedAdamW`): Burn's `AdamW` bit for bit,
//! in one pass per parameter on the CPU.

use burn::module::ParamGroup;
use burn::optim::ModuleOptimizer;
use kiln_kernels::FusedAdamWConfig;

/// The parameter paths weight decay leaves alone: every bias, every layer norm's scale and
/// shift, the token and position embeddings.
const NOT_DECAYED: [&str; 3] = [r"\.bias$", r"(^|\.)norm[^.]*\.", r"^(token|position)\."];

/// `config`'s AdamW for a [`Gpt`](crate::Gpt), its weight decay on the weight matrices only
/// (see the module's note); the rest use the same AdamW without decay.
///
/// ```
/// use kiln_kernels::FusedAdamWConfig;
/// let optimizer = kiln_gpt::adamw(&FusedAdamWConfig::new().with_weight_decay(0.1));
/// ```
pub fn adamw(config: &FusedAdamWConfig) -> ModuleOptimizer {
    let not_decayed =
        ParamGroup::from_any_regexes(NOT_DECAYED.to_vec()).expect("the patterns are valid");
    let mut optimizer = ModuleOptimizer::from(config.build()).with_group(
        not_decayed,
        config.clone().with_weight_decay(0.0).build(),
        None,
    );
    if let Some(clipping) = &config.grad_clipping {
        optimizer = optimizer.with_grad_clipping(clipping.init());
    }
    optimizer
}
