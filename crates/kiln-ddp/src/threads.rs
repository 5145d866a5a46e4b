//! Each replica computes in its own thread pool.
//!
//! Burn's CPU backend (Flex) runs its kernels on rayon's *current* pool: the global one unless
//! the caller installed another. Replicas sharing the global pool contend for every core and
//! each op's work is split for all of them; a pool per replica, sized to its share of the
//! cores, is what PyTorch ranks get from `torch.set_num_threads`.

use crate::DdpError;

/// The default threads of each of `local_replicas` replicas in this process: the machine's
/// cores divided among them (at least one each).
pub fn default_threads_per_replica(local_replicas: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / local_replicas.max(1)).max(1)
}

/// Builds replica `rank`'s compute pool of `threads` threads.
pub(crate) fn replica_pool(rank: usize, threads: usize) -> Result<rayon::ThreadPool, DdpError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("kiln-replica-{rank}-compute-{i}"))
        .build()
        .map_err(|err| DdpError::Config(format!("replica {rank}'s thread pool: {err}")))
}

/// The threads per replica: as configured (validated by `DdpConfig::validate`), else the
/// cores divided among `local_replicas`.
pub(crate) fn resolve_threads(configured: Option<usize>, local_replicas: usize) -> usize {
    configured.unwrap_or_else(|| default_threads_per_replica(local_replicas))
}
