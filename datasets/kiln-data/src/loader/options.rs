//! The loader's options of a training program (`--workers`, `--prefetch`): clap arguments with
//! the `clap` feature, range-checked as they are parsed.

use super::builder::DataLoaderBuilder;

/// How many threads load batches and how far ahead, as a program's options.
///
/// ```
/// use kiln_data::{LoaderOptions, SyntheticImages, DataLoader};
///
/// let options = LoaderOptions { workers: 2, prefetch: 4 };
/// let loader = options
///     .apply(DataLoader::builder(SyntheticImages::cifar_like(64, 10, 1)))
///     .batch_size(32)
///     .build();
/// assert_eq!(loader.num_batches(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct LoaderOptions {
    /// Loader worker threads (0: load on the training thread; at most 8 per core, 64 at least).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1, value_parser = worker_count))]
    pub workers: usize,
    /// Batches each worker prepares ahead.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2, value_parser = prefetch_depth))]
    pub prefetch: usize,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            workers: 1,
            prefetch: 2,
        }
    }
}

impl LoaderOptions {
    /// Refuses what clap's parsers would have (for options filled by hand).
    ///
    /// # Errors
    /// The flag and why, as text.
    pub fn check(&self) -> Result<(), String> {
        workers_in_range(self.workers).map_err(|why| format!("--workers: {why}"))?;
        if self.prefetch == 0 {
            return Err("--prefetch: must be at least 1".into());
        }
        Ok(())
    }

    /// `builder` with these workers and prefetch depth.
    pub fn apply(&self, builder: DataLoaderBuilder) -> DataLoaderBuilder {
        builder.num_workers(self.workers).prefetch(self.prefetch)
    }
}

/// Loader worker threads: 0 up to 8 per core, at least 64 (a worker is a thread; 100000 of
/// them exhausted the process instead of an error).
pub fn worker_count(text: &str) -> Result<usize, String> {
    workers_in_range(text.parse().map_err(|err| format!("not a count: {err}"))?)
}

fn workers_in_range(count: usize) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let most = (8 * cores).max(64);
    match count > most {
        true => Err(format!(
            "{count} loader workers, but at most {most} on this machine's {cores} cores"
        )),
        false => Ok(count),
    }
}

/// Batches prepared ahead: at least one.
#[cfg(any(feature = "clap", test))]
fn prefetch_depth(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(depth) => Ok(depth),
        Err(err) => Err(format!("not a count: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{prefetch_depth, worker_count};

    #[test]
    fn absurd_worker_counts_and_an_empty_prefetch_are_refused() {
        assert_eq!(worker_count("0"), Ok(0));
        assert!(worker_count("100000").unwrap_err().contains("at most"));
        assert!(worker_count("-1").unwrap_err().contains("not a count"));
        assert!(prefetch_depth("0").is_err());
        assert_eq!(prefetch_depth("3"), Ok(3));
        let by_hand = super::LoaderOptions {
            workers: 1,
            prefetch: 0,
        };
        assert!(by_hand.check().unwrap_err().contains("--prefetch"));
    }
}
