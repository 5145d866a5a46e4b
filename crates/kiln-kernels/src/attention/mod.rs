//! Causal multi-head self-attention: the entry point, its backend extension and the CPU
//! passes.

mod entry;
mod extension;
mod flex;
#[cfg(test)]
mod tests;

pub use entry::causal_attention;
pub use extension::AttentionKernel;
