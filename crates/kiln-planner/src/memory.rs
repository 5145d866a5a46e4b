//! Measuring how many bytes a piece of work keeps alive.
//!
//! Accelerator backends report their allocator's bytes in use
//! ([`Device::memory_pool_usage`]); Burn's CPU backend does not, so on the CPU kiln counts
//! the process's heap through [`TrackingAllocator`], which a binary opts into.

use burn::tensor::Device;
pub use kiln_core::TrackingAllocator;

/// Bytes `device` holds now: its allocator's bytes in use where the backend reports them,
/// else the process heap counted by [`TrackingAllocator`] when it is installed.
pub(crate) fn live_bytes(device: &Device) -> Option<u64> {
    device
        .memory_pool_usage()
        .map(|usage| usage.bytes_in_use)
        .or_else(TrackingAllocator::live_bytes)
}

/// Held by the tests that read the process-wide byte count, so they do not count each
/// other's allocations.
#[cfg(test)]
pub(crate) static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

// The unit tests of this crate run with the tracking allocator, as a binary would.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: TrackingAllocator = TrackingAllocator;
