//! The direct convolution: register tiles summed over the zero-padded input in place (the
//! taps over padding skipped), forward and weight gradient.

pub(crate) mod edges;
pub(crate) mod forward;
pub(crate) mod rows;
#[cfg(test)]
mod tests;
pub(crate) mod tile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile_avx2;
pub(crate) mod weight_gradient;
