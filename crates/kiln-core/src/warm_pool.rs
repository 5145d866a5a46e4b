//! Keep a compute pool's other threads awake between a step's parallel regions.
//!
//! A training step on the CPU is hundreds of short parallel regions (one per kernel, several
//! per layer) separated by serial stretches (autodiff bookkeeping, allocation, Burn's
//! single-threaded element-wise ops). rayon puts an idle worker to sleep after about 32
//! `sched_yield` rounds (tens of microseconds); the next region must then wake it with a
//! futex call and wait for it to be scheduled again, which on a virtual machine takes tens of
//! microseconds more. At ResNet-18 width 16 on 2 threads that was about 4 % of the replica
//! thread's samples in `try_to_wake_up` alone, and the helper thread sat idle or waking for
//! about a third of the step. OpenMP (what PyTorch's CPU kernels run on) spins for much
//! longer before it sleeps.
//!
//! [`install_warm`] runs work in a pool as `ThreadPool::install` does, while every other
//! thread of the pool polls for work with `rayon::yield_now` (which runs any job it finds,
//! stolen from the working thread included) instead of sleeping: it spins for
//! [`SPIN`] after its last job, then yields the core to other runnable threads until
//! [`YIELD`], then naps [`NAP`] at a time, so a long wait (data loading, a slow peer) costs
//! little CPU, and returns to polling at the next job. Only worth it when the pool's threads
//! have cores of their own: an oversubscribed machine would lose the cycles the pollers
//! burn, so callers pass `warm = false` there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a poller spins after its last job before it starts yielding its core.
pub const SPIN: Duration = Duration::from_micros(200);

/// How long a poller yields its core (`sched_yield`) after its last job before it naps.
pub const YIELD: Duration = Duration::from_millis(2);

/// One nap of an idle poller: the longest a job can wait for it after a long idle spell.
pub const NAP: Duration = Duration::from_micros(100);

/// Processes of this job on this machine, as the MPI launcher says (Open MPI's
/// `OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's `MPI_LOCALNRANKS`); 1 outside a launcher.
pub fn processes_on_this_machine() -> usize {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse::<usize>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Whether `pools` pools of `threads` threads each in this process may keep their threads
/// polling ([`install_warm`]): only where every thread of every pool of every process of
/// the job on this machine has a core of its own, since pollers burn the cycles they wait.
pub fn pools_may_poll(threads: usize, pools: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    threads * pools * processes_on_this_machine() <= cores
}

/// Runs `work` in `pool` (as [`rayon::ThreadPool::install`]) with the pool's other threads
/// kept polling for work until `work` returns; with `warm` false, exactly `pool.install`.
///
/// ```
/// let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
/// let sum: u64 = kiln_core::install_warm(&pool, true, || {
///     use rayon::prelude::*;
///     (0..1000u64).into_par_iter().sum()
/// });
/// assert_eq!(sum, 499_500);
/// ```
pub fn install_warm<R, F>(pool: &rayon::ThreadPool, warm: bool, work: F) -> R
where
    R: Send,
    F: FnOnce() -> R + Send,
{
    install_warm_counted(pool, warm, work, &Arc::new(AtomicUsize::new(0)))
}

/// [`install_warm`], counting the pollers that are running in `running` (for tests).
pub(crate) fn install_warm_counted<R, F>(
    pool: &rayon::ThreadPool,
    warm: bool,
    work: F,
    running: &Arc<AtomicUsize>,
) -> R
where
    R: Send,
    F: FnOnce() -> R + Send,
{
    if !warm || pool.current_num_threads() < 2 {
        return pool.install(work);
    }
    pool.install(|| {
        let worker = rayon::current_thread_index();
        let stop = Arc::new(AtomicBool::new(false));
        // Stops the pollers however `work` ends (a panic included).
        let _stop_on_exit = StopOnDrop(Arc::clone(&stop));
        let pollers_stop = Arc::clone(&stop);
        let running = Arc::clone(running);
        rayon::spawn_broadcast(move |context| {
            // The thread running `work` gets its copy when it next looks for work (inside a
            // join): it must not poll there, or it would not return to `work`.
            if Some(context.index()) != worker {
                running.fetch_add(1, Ordering::SeqCst);
                poll_until(&pollers_stop);
                running.fetch_sub(1, Ordering::SeqCst);
            }
        });
        work()
    })
}

/// Sets the flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs the pool's jobs as they appear until `stop` is set.
fn poll_until(stop: &AtomicBool) {
    let mut idle_since: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_since = None,
            Some(rayon::Yield::Idle) => {
                let idle = idle_since.get_or_insert_with(Instant::now).elapsed();
                if idle < SPIN {
                    std::hint::spin_loop();
                } else if idle < YIELD {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(NAP);
                }
            }
            // Not on a pool thread: cannot happen inside `spawn_broadcast`.
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
    }

    /// Waits up to `limit` for `condition`.
    fn eventually(limit: Duration, condition: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if condition() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        condition()
    }

    #[test]
    fn pollers_run_during_the_work_and_stop_after_it() {
        let pool = pool(3);
        let running = Arc::new(AtomicUsize::new(0));
        let seen = install_warm_counted(
            &pool,
            true,
            || {
                // Both other threads start polling (bounded wait: a bug fails, not hangs).
                let up = eventually(Duration::from_secs(10), || {
                    running.load(Ordering::SeqCst) == 2
                });
                // Parallel work still runs, on every thread, with the pollers stealing it.
                let sum: u64 = (0..100_000u64).into_par_iter().sum();
                assert_eq!(sum, 4_999_950_000);
                up
            },
            &running,
        );
        assert!(seen, "the pollers did not start");
        assert!(
            eventually(Duration::from_secs(10), || running.load(Ordering::SeqCst)
                == 0),
            "pollers still running after the work returned"
        );
    }

    #[test]
    fn cold_and_single_thread_pools_start_no_pollers() {
        let running = Arc::new(AtomicUsize::new(0));
        for (threads, warm) in [(2, false), (1, true)] {
            let pool = pool(threads);
            install_warm_counted(
                &pool,
                warm,
                || {
                    std::thread::sleep(Duration::from_millis(20));
                    assert_eq!(running.load(Ordering::SeqCst), 0);
                },
                &running,
            );
        }
        // Control: a warm pool of two does start one (the counter sees it).
        let pool = pool(2);
        let started = install_warm_counted(
            &pool,
            true,
            || {
                eventually(Duration::from_secs(10), || {
                    running.load(Ordering::SeqCst) == 1
                })
            },
            &running,
        );
        assert!(started);
    }

    #[test]
    fn a_panic_in_the_work_stops_the_pollers() {
        let pool = pool(2);
        let running = Arc::new(AtomicUsize::new(0));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            install_warm_counted(
                &pool,
                true,
                || {
                    eventually(Duration::from_secs(10), || {
                        running.load(Ordering::SeqCst) == 1
                    });
                    panic!("work failed");
                },
                &running,
            )
        }));
        assert!(result.is_err());
        assert!(
            eventually(Duration::from_secs(10), || running.load(Ordering::SeqCst)
                == 0),
            "pollers still running after the work panicked"
        );
    }
}
