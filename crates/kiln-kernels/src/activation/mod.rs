//! ReLU, a residual block's fused `relu(a + b)` and GELU on Flex.

pub(crate) mod entry;
mod erf;
pub(crate) mod extension;
pub(crate) mod flex;
#[cfg(test)]
mod tests;
