//! Memory accounts: the bytes that the threads charged to one piece of work allocate, counted
//! until released (by any thread), and their peak — a pipeline stage's memory, say, apart
//! from the other stages' in the same process.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use super::allocator::installed;

/// Accounts that can be open at once (account 0 is "none").
const ACCOUNTS: usize = 256;

static LIVE: [AtomicI64; ACCOUNTS] = [const { AtomicI64::new(0) }; ACCOUNTS];
static PEAK: [AtomicI64; ACCOUNTS] = [const { AtomicI64::new(0) }; ACCOUNTS];
static OPEN: [AtomicBool; ACCOUNTS] = [const { AtomicBool::new(false) }; ACCOUNTS];

thread_local! {
    // No destructor and a constant initialiser: the allocator may read it at any time,
    // including while the thread's other locals are torn down.
    static CURRENT: Cell<u8> = const { Cell::new(0) };
}

/// The account the current thread charges (0: none).
pub(super) fn current() -> u8 {
    CURRENT.try_with(Cell::get).unwrap_or(0)
}

pub(super) fn record(account: u8, size: usize) {
    if account != 0 {
        let slot = usize::from(account);
        let live = LIVE[slot].fetch_add(size as i64, Ordering::Relaxed) + size as i64;
        PEAK[slot].fetch_max(live, Ordering::Relaxed);
    }
}

pub(super) fn release(account: u8, size: usize) {
    if account != 0 {
        LIVE[usize::from(account)].fetch_sub(size as i64, Ordering::Relaxed);
    }
}

/// The bytes allocated by the threads that charge it, through
/// [`TrackingAllocator`](super::TrackingAllocator), and not yet released (whichever thread
/// releases them), with their peak.
///
/// A block counts in the account of the thread that allocated it for its whole life: a tensor
/// one stage computes and the next one drops is the first one's until then. An account closes
/// when dropped; its number is taken again only once every block counted in it is released,
/// so a later account never inherits an earlier one's blocks.
///
/// ```
/// use kiln_core::{MemoryAccount, TrackingAllocator};
///
/// #[global_allocator]
/// static ALLOCATOR: TrackingAllocator = TrackingAllocator;
///
/// fn main() {
///     // `None` unless the binary installs kiln's `TrackingAllocator`, as this one does.
///     let account = MemoryAccount::open().expect("the tracking allocator is installed");
///     let buffer = {
///         let _charging = account.charge();
///         vec![0u8; 1 << 20]
///     };
///     // Released on another thread: still this account's block.
///     std::thread::spawn(move || drop(buffer)).join().unwrap();
///     assert!(account.peak_bytes() >= 1 << 20);
///     assert_eq!(account.live_bytes(), 0);
/// }
/// ```
#[derive(Debug)]
pub struct MemoryAccount {
    id: AccountId,
}

/// An open account's number, for threads that charge it for their whole life (a stage's
/// compute pool, from its start handler): [`AccountId::charge_this_thread`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountId(u8);

impl MemoryAccount {
    /// A new account, with nothing in it; `None` when [`TrackingAllocator`](super::TrackingAllocator)
    /// is not the global allocator, or when all 255 accounts are open or still count
    /// unreleased blocks.
    pub fn open() -> Option<Self> {
        if !installed() {
            return None;
        }
        (1..ACCOUNTS).find_map(|slot| {
            OPEN[slot]
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .ok()?;
            if LIVE[slot].load(Ordering::Relaxed) != 0 {
                OPEN[slot].store(false, Ordering::Release);
                return None;
            }
            PEAK[slot].store(0, Ordering::Relaxed);
            let id = AccountId(u8::try_from(slot).expect("fewer than 256 accounts"));
            Some(Self { id })
        })
    }

    /// Charges the current thread's allocations to this account until the guard drops (then
    /// to whatever the thread charged before).
    pub fn charge(&self) -> Charging<'_> {
        let previous = current();
        self.id.charge_this_thread();
        Charging {
            previous,
            _account: PhantomData,
        }
    }

    /// Its number, for threads that charge it for their whole life.
    pub fn id(&self) -> AccountId {
        self.id
    }

    /// Bytes counted in it and not yet released.
    pub fn live_bytes(&self) -> u64 {
        LIVE[usize::from(self.id.0)].load(Ordering::Relaxed).max(0) as u64
    }

    /// The most bytes alive in it at once since it opened or since [`reset_peak`](Self::reset_peak).
    pub fn peak_bytes(&self) -> u64 {
        PEAK[usize::from(self.id.0)].load(Ordering::Relaxed).max(0) as u64
    }

    /// Starts its peak again from the bytes alive in it now.
    pub fn reset_peak(&self) {
        let slot = usize::from(self.id.0);
        PEAK[slot].store(LIVE[slot].load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Drop for MemoryAccount {
    fn drop(&mut self) {
        OPEN[usize::from(self.id.0)].store(false, Ordering::Release);
    }
}

impl AccountId {
    /// Charges everything the current thread allocates from now on to this account. For
    /// threads that live no longer than the account (a thread that outlives it would go on
    /// counting in a closed account, and keep its number from being taken again).
    pub fn charge_this_thread(self) {
        // Only fails while the thread is torn down, when it charges nothing any more.
        let _ = CURRENT.try_with(|current| current.set(self.0));
    }
}

/// Charges the thread to an account while it lives ([`MemoryAccount::charge`]). Not `Send`:
/// it restores the thread it was made on.
#[derive(Debug)]
pub struct Charging<'account> {
    previous: u8,
    _account: PhantomData<(&'account MemoryAccount, *const ())>,
}

impl Drop for Charging<'_> {
    fn drop(&mut self) {
        let previous = self.previous;
        let _ = CURRENT.try_with(|current| current.set(previous));
    }
}
