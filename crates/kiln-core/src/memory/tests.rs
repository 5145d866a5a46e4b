//! The allocator's counts and blocks, and the accounts; this crate's unit tests run with the
//! tracking allocator installed, as a binary would.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Mutex;

use super::{MemoryAccount, TrackingAllocator};

#[global_allocator]
static ALLOCATOR: TrackingAllocator = TrackingAllocator;

/// Held by the tests that read the process-wide count, so they do not count each other's
/// allocations.
static MEASURING: Mutex<()> = Mutex::new(());

/// Held by the tests that open accounts: one of them opens every account there is. (Accounts
/// need no other lock: only their own threads charge them.)
static OPENING: Mutex<()> = Mutex::new(());

/// Whether an account's count is `expected` bytes, give or take what the test's own
/// bookkeeping allocates on a charged thread.
fn near(bytes: u64, expected: u64) -> bool {
    (expected..expected + 4096).contains(&bytes)
}

/// One measurement of the process-wide count around a buffer's life: the error says which
/// expectation a reading missed.
fn the_count_follows_one_buffer() -> Result<(), String> {
    let slack = 64u64 << 10;
    let before = TrackingAllocator::live_bytes().expect("installed in this test binary");
    TrackingAllocator::reset_peak();
    let mut buffer = vec![0u8; 1 << 20];
    buffer[7] = 1;
    let held = TrackingAllocator::live_bytes().unwrap();
    if held + slack < before + (1 << 20) {
        return Err(format!("holding 1 MiB: {before} -> {held}"));
    }
    let mut grown = buffer;
    grown.resize(3 << 20, 0);
    assert_eq!(grown[7], 1, "a reallocation keeps the contents");
    let grown_bytes = TrackingAllocator::live_bytes().unwrap();
    if grown_bytes + slack < before + (3 << 20) {
        return Err(format!("holding 3 MiB: {before} -> {grown_bytes}"));
    }
    drop(grown);
    let after = TrackingAllocator::live_bytes().unwrap();
    if after >= before + (512 << 10) {
        return Err(format!("after the drop: {before} -> {after}"));
    }
    let peak = TrackingAllocator::peak_bytes().unwrap();
    if peak + slack < before + (3 << 20) {
        return Err(format!("peak {peak} from {before}"));
    }
    TrackingAllocator::reset_peak();
    let reset = TrackingAllocator::peak_bytes().unwrap();
    if reset >= before + (1 << 20) {
        return Err(format!("peak after a reset {reset} from {before}"));
    }
    Ok(())
}

#[test]
fn the_process_count_follows_what_is_alive_and_its_peak() {
    let _alone = MEASURING.lock();
    // The count is the whole process's: another test thread may allocate or free megabytes
    // between two readings (CI saw 1.3 MB). A wrong count misses on every try; noise does not
    // last through five.
    let mut misses = Vec::new();
    for _ in 0..5 {
        match the_count_follows_one_buffer() {
            Ok(()) => return,
            Err(miss) => misses.push(miss),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("every try missed: {misses:#?}");
}

#[test]
fn blocks_are_aligned_zeroed_and_keep_their_contents_when_moved() {
    for align in [1usize, 2, 8, 16, 32, 64, 4096] {
        for size in [1usize, 3, 64, 1000, 1 << 16] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero size; every block is released with its layout below.
            unsafe {
                let zeroed = ALLOCATOR.alloc_zeroed(layout);
                assert!(!zeroed.is_null());
                assert_eq!(zeroed as usize % align, 0, "size {size} align {align}");
                assert!(
                    std::slice::from_raw_parts(zeroed, size)
                        .iter()
                        .all(|&b| b == 0)
                );
                ALLOCATOR.dealloc(zeroed, layout);

                let block = ALLOCATOR.alloc(layout);
                assert_eq!(block as usize % align, 0);
                for i in 0..size {
                    block.add(i).write((i % 251) as u8);
                }
                let grown = ALLOCATOR.realloc(block, layout, size * 3);
                assert_eq!(grown as usize % align, 0);
                for i in 0..size {
                    assert_eq!(
                        grown.add(i).read(),
                        (i % 251) as u8,
                        "size {size} align {align}"
                    );
                }
                let shrunk = ALLOCATOR.realloc(
                    grown,
                    Layout::from_size_align(size * 3, align).unwrap(),
                    size,
                );
                for i in 0..size {
                    assert_eq!(shrunk.add(i).read(), (i % 251) as u8);
                }
                ALLOCATOR.dealloc(shrunk, layout);
            }
        }
    }
}

#[test]
fn an_account_counts_its_threads_blocks_until_any_thread_releases_them() {
    let _opening = OPENING.lock();
    let account = MemoryAccount::open().expect("installed in this test binary");
    assert_eq!((account.live_bytes(), account.peak_bytes()), (0, 0));
    let (first, second) = {
        let _charging = account.charge();
        (vec![1u8; 1 << 20], vec![2u8; 1 << 19])
    };
    // Not charged: the guard is gone.
    let other = vec![3u8; 1 << 21];
    let held = account.live_bytes();
    assert!(near(held, (1 << 20) + (1 << 19)), "{held}");
    std::thread::spawn(move || drop(first)).join().unwrap();
    assert!(account.live_bytes() < (1 << 19) + 4096);
    let mut second = second;
    {
        // Grown by a thread that charges nothing: still this account's block.
        second.resize(1 << 21, 0);
    }
    let grown = account.live_bytes();
    assert!(near(grown, 1 << 21), "{grown}");
    drop((second, other));
    assert_eq!(account.live_bytes(), 0);
    let peak = account.peak_bytes();
    assert!((1 << 21..(1 << 21) + (1 << 20)).contains(&peak), "{peak}");
    account.reset_peak();
    assert_eq!(account.peak_bytes(), 0);
}

#[test]
fn accounts_are_apart_and_a_thread_charges_what_it_charged_before_after_a_guard() {
    let _opening = OPENING.lock();
    let outer = MemoryAccount::open().unwrap();
    let inner = MemoryAccount::open().unwrap();
    assert_ne!(outer.id(), inner.id());
    let _outer = outer.charge();
    let a = vec![0u8; 100_000];
    let b = {
        let _inner = inner.charge();
        vec![0u8; 200_000]
    };
    let c = vec![0u8; 300_000];
    assert!(near(outer.live_bytes(), 400_000), "{}", outer.live_bytes());
    assert!(near(inner.live_bytes(), 200_000), "{}", inner.live_bytes());
    // A thread charged for its whole life, as a compute pool's are.
    let id = inner.id();
    let d = std::thread::spawn(move || {
        id.charge_this_thread();
        vec![0u8; 50_000]
    })
    .join()
    .unwrap();
    assert!(near(inner.live_bytes(), 250_000));
    drop((a, b, c, d));
}

#[test]
fn an_account_number_is_taken_again_only_once_its_blocks_are_released() {
    let _opening = OPENING.lock();
    let account = MemoryAccount::open().unwrap();
    let id = account.id();
    let kept = {
        let _charging = account.charge();
        vec![0u8; 10_000]
    };
    drop(account);
    let mut opened: Vec<MemoryAccount> = Vec::new();
    while let Some(next) = MemoryAccount::open() {
        assert_ne!(next.id(), id, "a number whose block is alive");
        opened.push(next);
    }
    // Every other number is taken.
    drop(kept);
    let again = MemoryAccount::open().expect("its block is released");
    assert_eq!(again.id(), id);
    assert_eq!((again.live_bytes(), again.peak_bytes()), (0, 0));
}
