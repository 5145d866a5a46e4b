//! Layer norm over the last dimension: the entry point, its backend extension and the CPU
//! passes.

mod entry;
mod extension;
mod flex;
#[cfg(test)]
mod tests;

pub use entry::layer_norm;
pub use extension::LayerNormKernel;
