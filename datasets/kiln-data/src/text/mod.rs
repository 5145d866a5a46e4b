//! Text for language models: a corpus of bytes (the shipped Jargon File, or a user's file),
//! cut into context windows at seeded random offsets, sharded across replicas.

mod batch;
mod corpus;
#[cfg(test)]
mod tests;
mod windows;

pub use batch::TokenBatch;
pub use corpus::TextCorpus;
pub use windows::{TextWindows, TextWindowsBuilder};
