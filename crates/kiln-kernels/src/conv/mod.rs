//! 2-D convolution: the entry points, the path each pass takes (`path.rs`), and one folder
//! or file per algorithm (`im2col/`, `winograd/`, `direct/`, `shifted.rs`).

pub(crate) mod block_sum;
pub(crate) mod dims;
pub(crate) mod direct;
pub(crate) mod entry;
pub(crate) mod extension;
pub(crate) mod flex;
pub(crate) mod geometry;
pub(crate) mod im2col;
pub(crate) mod path;
pub(crate) mod probe;
pub(crate) mod shifted;
#[cfg(test)]
mod shifted_tests;
#[cfg(test)]
mod tests;
pub(crate) mod winograd;
