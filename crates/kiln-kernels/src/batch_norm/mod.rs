//! Batch norm on Flex: training-mode statistics and backward, and inference with running
//! statistics.

pub(crate) mod entry;
pub(crate) mod extension;
pub(crate) mod flex;
#[cfg(test)]
mod inference_tests;
#[cfg(test)]
mod tests;
