//! The global allocator that counts: the system allocator with each block's size added to
//! the process's count and to the count of the account its thread charged, while it lives.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::account;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Bytes in front of each block, at least: they hold its account (the last byte), and keep
/// the block aligned (the header is padded to the block's alignment).
const HEADER: usize = 16;

/// The system allocator, counting the bytes it has handed out and not yet taken back (the
/// process's, and each [`MemoryAccount`](super::MemoryAccount)'s), so that the planner can
/// measure what a segment keeps for backward and a pipeline what each stage holds, on the CPU.
///
/// Install it in your binary to profile memory on CPU devices:
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: kiln_core::TrackingAllocator = kiln_core::TrackingAllocator;
/// ```
///
/// Its cost, per allocation and per release: a few atomic additions and a thread-local
/// read (Burn allocates per tensor, not per element), and 16 bytes (more for blocks aligned
/// to more) in front of each block, which name the account the block is counted in.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackingAllocator;

impl TrackingAllocator {
    /// Bytes allocated through it and not yet released; `None` when it is not the global
    /// allocator (nothing has been allocated through it).
    pub fn live_bytes() -> Option<u64> {
        installed().then(|| LIVE.load(Ordering::Relaxed))
    }

    /// The most bytes alive at once since the start or the last [`reset_peak`](Self::reset_peak);
    /// `None` when it is not the global allocator.
    pub fn peak_bytes() -> Option<u64> {
        installed().then(|| PEAK.load(Ordering::Relaxed))
    }

    /// Starts the peak again from the bytes alive now.
    pub fn reset_peak() {
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// Whether this is the global allocator.
pub(super) fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

fn record(size: usize, account: u8) {
    let live = LIVE.fetch_add(size as u64, Ordering::Relaxed) + size as u64;
    PEAK.fetch_max(live, Ordering::Relaxed);
    account::record(account, size);
    // Read first: after the first allocation the flag's line stays shared, not written.
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

fn release(size: usize, account: u8) {
    LIVE.fetch_sub(size as u64, Ordering::Relaxed);
    account::release(account, size);
}

/// The layout asked of `System` for a block of `layout`, and where the block starts in it:
/// `None` where the padded size overflows (the allocation then fails, as it would).
fn padded(layout: Layout) -> Option<(Layout, usize)> {
    let offset = layout.align().max(HEADER);
    let size = layout.size().checked_add(offset)?;
    Layout::from_size_align(size, offset)
        .ok()
        .map(|padded| (padded, offset))
}

/// Writes `account` into the header of the padded block at `base` and returns the block.
///
/// # Safety
/// `base` is a live allocation of the padded layout whose block starts at `offset`.
unsafe fn start_block(base: *mut u8, offset: usize, size: usize) -> *mut u8 {
    let account = account::current();
    // SAFETY: `offset ≥ HEADER ≥ 1` bytes of the allocation lie before the block.
    let block = unsafe { base.add(offset) };
    // SAFETY: the byte before the block is inside the header, which the caller owns.
    unsafe { block.sub(1).write(account) };
    record(size, account);
    block
}

/// A block of `layout` from `system` (`System`'s `alloc` or `alloc_zeroed`), its account
/// written in front; null where either fails.
///
/// # Safety
/// `layout` as `GlobalAlloc::alloc` requires it (a non-zero size).
unsafe fn allocate(layout: Layout, system: unsafe fn(&System, Layout) -> *mut u8) -> *mut u8 {
    let Some((padded, offset)) = padded(layout) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `padded` has a non-zero size (it includes the header).
    let base = unsafe { system(&System, padded) };
    if base.is_null() {
        return base;
    }
    // SAFETY: `base` is a fresh allocation of `padded`, the block at `offset`.
    unsafe { start_block(base, offset, layout.size()) }
}

// SAFETY: every block handed out is the tail of a `System` allocation of the padded layout
// (`padded`): aligned to at least the requested alignment (the offset is a multiple of it),
// as large as requested, owned by the caller until released. Release and reallocation find
// the `System` allocation again from the caller's layout, which the `GlobalAlloc` contract
// makes the one the block was allocated with, so the same offset; the header byte is only
// read and written inside the padding, never inside a block.
unsafe impl GlobalAlloc for TrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is `System`'s.
        unsafe { allocate(layout, GlobalAlloc::alloc) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`; only the header's last byte is written, the block stays zero.
        unsafe { allocate(layout, GlobalAlloc::alloc_zeroed) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let (padded, offset) = padded(layout).expect("the layout allocated this block");
        // SAFETY: `block` came from `alloc` with `layout`, so it is `offset` bytes into a
        // `System` allocation of `padded`, whose header holds its account.
        let account = unsafe { block.sub(1).read() };
        release(layout.size(), account);
        // SAFETY: as above; the allocation is released once, here.
        unsafe { System.dealloc(block.sub(offset), padded) };
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (padded, offset) = padded(layout).expect("the layout allocated this block");
        let Some(new_padded) = new_size
            .checked_add(offset)
            .filter(|&size| Layout::from_size_align(size, offset).is_ok())
        else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `dealloc`.
        let account = unsafe { block.sub(1).read() };
        // SAFETY: the allocation is `System`'s with `padded`; the new size keeps the same
        // alignment valid (checked above). `System` copies the header with the block, so the
        // block keeps its account.
        let base = unsafe { System.realloc(block.sub(offset), padded, new_padded) };
        if base.is_null() {
            return base;
        }
        release(layout.size(), account);
        record(new_size, account);
        // SAFETY: the new allocation has the header in front, as before.
        unsafe { base.add(offset) }
    }
}
