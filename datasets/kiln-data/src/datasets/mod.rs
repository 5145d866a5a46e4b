//! The data sets kiln reads.

mod cifar;
mod mnist;
mod read;
mod synthetic;

pub use cifar::Cifar10;
pub use mnist::Mnist;
pub use synthetic::SyntheticImages;

#[cfg(test)]
mod tests;
