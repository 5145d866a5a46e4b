//! Winograd's minimal filtering: F(2×2, 3×3) (`f2.rs`) and F(4×4, 3×3) (`f4.rs`), their
//! tile transforms and the batched GEMMs over transformed tiles.

pub(crate) mod batched;
pub(crate) mod f2;
#[cfg(test)]
mod f2_tests;
pub(crate) mod f4;
#[cfg(test)]
mod f4_tests;
pub(crate) mod f4_tiles;
pub(crate) mod images;
pub(crate) mod tiles;
