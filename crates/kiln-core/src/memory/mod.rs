//! Counting the bytes that work keeps alive on the CPU: the whole process's
//! ([`TrackingAllocator`]) and a piece of work's on the threads it runs on
//! ([`MemoryAccount`]), each with its peak.
//!
//! Accelerator backends report their allocator's bytes in use
//! (`Device::memory_pool_usage`); Burn's CPU backend does not, so on the CPU kiln counts the
//! heap, once a binary installs the allocator.

mod account;
mod allocator;
#[cfg(test)]
mod tests;

pub use account::{AccountId, Charging, MemoryAccount};
pub use allocator::TrackingAllocator;
