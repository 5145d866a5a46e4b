//! Measuring how many bytes a piece of work keeps alive.
//!
//! Accelerator backends report their allocator's bytes in use
//! ([`Device::memory_pool_usage`]); Burn's CPU backend does not, so on the CPU kiln counts
//! the process's heap through [`TrackingAllocator`], which a binary opts into.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use burn::tensor::Device;

static LIVE: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting the bytes it has handed out and not yet taken back, so
/// the planner can measure the activations a segment keeps for backward on the CPU.
///
/// Install it in your binary to profile memory on CPU devices:
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: kiln_planner::TrackingAllocator = kiln_planner::TrackingAllocator;
/// ```
///
/// Its cost is one atomic addition per allocation and per release (Burn allocates per
/// tensor, not per element).
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackingAllocator;

impl TrackingAllocator {
    /// Bytes allocated through it and not yet released; `None` when it is not the global
    /// allocator (nothing has been allocated through it).
    pub fn live_bytes() -> Option<u64> {
        INSTALLED
            .load(Ordering::Relaxed)
            .then(|| LIVE.load(Ordering::Relaxed))
    }
}

fn record(size: usize) {
    LIVE.fetch_add(size as u64, Ordering::Relaxed);
    // Read first: after the first allocation the flag's line stays shared, not written.
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

fn release(size: usize) {
    LIVE.fetch_sub(size as u64, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract (valid layouts, pointers from this allocator) is the caller's to
// keep exactly as for `System`; the counters only observe sizes and never touch memory.
unsafe impl GlobalAlloc for TrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is `System`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            record(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            record(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, hence from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        release(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; `new_size` is the caller's to check.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            release(layout.size());
            record(new_size);
        }
        new
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    // The unit tests of this crate run with the tracking allocator, as a binary would.
    #[global_allocator]
    static ALLOCATOR: TrackingAllocator = TrackingAllocator;

    #[test]
    fn counts_what_is_alive_and_forgets_what_is_released() {
        let _alone = MEASURING.lock();
        let before = TrackingAllocator::live_bytes().expect("installed in this test binary");
        let mut buffer = vec![0u8; 1 << 20];
        buffer[7] = 1;
        let held = TrackingAllocator::live_bytes().unwrap();
        // Other test threads allocate too: a megabyte stands well above their noise.
        assert!(
            held >= before + (1 << 20) - (64 << 10),
            "{before} -> {held}"
        );
        let mut grown = buffer;
        grown.resize(3 << 20, 0);
        let grown_bytes = TrackingAllocator::live_bytes().unwrap();
        assert!(grown_bytes >= before + (3 << 20) - (64 << 10));
        drop(grown);
        let after = TrackingAllocator::live_bytes().unwrap();
        assert!(after < before + (512 << 10), "{before} -> {after}");
        let zeroed = vec![0u64; 1 << 17];
        assert!(TrackingAllocator::live_bytes().unwrap() >= before + (1 << 20) - (64 << 10));
        assert_eq!(zeroed.iter().sum::<u64>(), 0);
    }
}
