//! The in-process backend: N ranks as N threads sharing memory.

mod collectives;
mod group;
mod rendezvous;

pub use collectives::InProcessCommunicator;
pub use group::InProcessGroup;
pub(crate) use group::Shared;

#[cfg(test)]
mod tests;
