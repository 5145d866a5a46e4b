//! Keep freed memory in the process, so that each training step reuses the pages the last
//! one freed instead of faulting fresh ones in.
//!
//! A training step allocates and frees the same buffers every step (activations, gradients,
//! kernel scratch), megabytes each. glibc's malloc serves blocks that large from `mmap` and
//! gives them back on `free`, or trims its heap when its free top grows, so the next step
//! faults every page in again, and the kernel zeroes each one first: at ResNet-18 width 64 on
//! one thread that was about 30 000 page faults per step, ~50–100 ms of system time in a
//! ~1.1 s step. [`retain_freed_memory`] raises glibc's thresholds so such blocks come from
//! the heap and stay there: the process keeps its peak working set (as PyTorch's GPU caching
//! allocator does), and steps after the first fault almost nothing in.
//!
//! The settings are process-wide, so a program calls this once, at the start of `main`,
//! before it starts threads. Setting `MALLOC_MMAP_THRESHOLD_` or related environment variables
//! has the same effect without code.

use thiserror::Error;

/// Blocks up to this size come from malloc's heaps instead of their own `mmap`: glibc's
/// largest accepted value (half its 64 MiB per-thread heap), above every buffer of the
/// models kiln ships at batch 32.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Free memory at the top of a heap is returned to the system only above this size.
pub const TRIM_THRESHOLD: usize = 1 << 30;

/// One malloc arena for every thread. glibc gives each new thread a heap of its own (up to 8
/// per core), built from 64 MiB pieces that it unmaps whenever one falls empty, whatever the
/// trim threshold: a replica thread's step of 100–500 MiB then faulted about 60 000 pages
/// in again every step at ResNet-18 width 64 (as many as PyTorch does). The main arena grows
/// in one piece and keeps it; small blocks still come from each thread's lock-free cache.
pub const ARENA_MAX: usize = 1;

/// Extra memory requested whenever a heap grows, so that a growing step does not grow it
/// one block at a time.
pub const TOP_PAD: usize = 256 << 20;

/// Why the allocator could not be configured.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FreedMemoryError {
    /// Only glibc's malloc is configured; other allocators keep their own policy.
    #[error(
        "keeping freed memory is configured for glibc's malloc only; this build uses another \
         allocator, which keeps its own policy"
    )]
    Unsupported,
    /// glibc refused one of the settings.
    #[error("glibc's mallopt refused {option} = {value}")]
    Refused {
        /// The setting's name, as glibc's `mallopt` documents it.
        option: &'static str,
        /// The value it refused.
        value: usize,
    },
}

/// Make glibc's malloc keep freed memory in the process: blocks up to [`MMAP_THRESHOLD`] from
/// its heaps, returned to the system only past [`TRIM_THRESHOLD`] of free memory, heaps grown
/// [`TOP_PAD`] at a time. The process then holds on to its peak memory for its lifetime.
///
/// Call it once, first thing in `main`: the settings are process-wide.
///
/// ```
/// match kiln_core::retain_freed_memory() {
///     Ok(()) => {}
///     // Other allocators (musl, macOS, a custom global allocator's own) keep their policy.
///     Err(err) => eprintln!("note: {err}"),
/// }
/// ```
///
/// # Errors
/// [`FreedMemoryError::Unsupported`] where the C library is not glibc,
/// [`FreedMemoryError::Refused`] if glibc rejects a setting.
pub fn retain_freed_memory() -> Result<(), FreedMemoryError> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        for (option, name, value) in [
            (libc::M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD", MMAP_THRESHOLD),
            (libc::M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD", TRIM_THRESHOLD),
            (libc::M_TOP_PAD, "M_TOP_PAD", TOP_PAD),
            (libc::M_ARENA_MAX, "M_ARENA_MAX", ARENA_MAX),
        ] {
            let refused = || FreedMemoryError::Refused {
                option: name,
                value,
            };
            let value_arg = libc::c_int::try_from(value).map_err(|_| refused())?;
            // SAFETY: `mallopt` only changes malloc's tuning parameters, under malloc's own
            // lock; any value is safe to pass (glibc validates it and returns 0 to refuse).
            if unsafe { libc::mallopt(option, value_arg) } != 1 {
                return Err(refused());
            }
        }
        Ok(())
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        Err(FreedMemoryError::Unsupported)
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::retain_freed_memory;

    /// Minor page faults of the calling thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable `rusage`; RUSAGE_THREAD is supported on Linux.
        let status = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(status, 0, "getrusage failed");
        usage.ru_minflt
    }

    /// Faults while allocating, writing and freeing an 8 MiB buffer (2048 pages).
    fn faults_of_one_buffer() -> i64 {
        let before = minor_faults();
        let mut buffer = vec![1.0f32; 2 << 20];
        buffer[12345] = 2.0;
        std::hint::black_box(&buffer);
        drop(buffer);
        minor_faults() - before
    }

    #[test]
    fn a_freed_buffer_is_reused_without_faulting_its_pages_again() {
        // Control: with blocks this large served by `mmap` (glibc's default threshold, held
        // fixed), every buffer faults its pages in again; the counter must see that.
        // SAFETY: as in `retain_freed_memory`; 128 KiB is glibc's own default.
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) };
        assert_eq!(set, 1);
        // (2048 faults with 4 KiB pages; as few as 4 where transparent huge pages back it.)
        let mapped: Vec<i64> = (0..2).map(|_| faults_of_one_buffer()).collect();
        let fewest = *mapped.iter().min().expect("two counts");
        assert!(
            fewest >= 4,
            "mapped buffers faulted only {mapped:?} pages in"
        );
        retain_freed_memory().expect("glibc accepts the settings");
        // The first buffer after the call may grow the heap; every later one reuses it.
        faults_of_one_buffer();
        let again: Vec<i64> = (0..3).map(|_| faults_of_one_buffer()).collect();
        assert!(
            again.iter().all(|&faults| faults * 8 <= fewest),
            "reused buffers faulted {again:?} pages in (mapped ones {mapped:?})"
        );
    }
}
