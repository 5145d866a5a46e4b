//! Where a run starts — fresh, from the latest whole checkpoint, or from a named one — and
//! how it restarts after a failure: from the newest checkpoint that verifies.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::{CheckpointError, CheckpointStore};

/// Where a run starts (what a `--resume` option names).
///
/// ```
/// use kiln_checkpoint::ResumeFrom;
/// assert_eq!("latest".parse::<ResumeFrom>(), Ok(ResumeFrom::Latest));
/// assert_eq!("runs/a/step-40".parse(), Ok(ResumeFrom::Path("runs/a/step-40".into())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResumeFrom {
    /// The beginning. Refused when the run's store already holds checkpoints: a second run
    /// there would mix its checkpoints with the first's.
    #[default]
    Fresh,
    /// The newest checkpoint of the store that verifies (newer ones that do not are
    /// skipped, each said on stderr); the beginning when there is none yet.
    Latest,
    /// This checkpoint.
    Path(PathBuf),
}

impl FromStr for ResumeFrom {
    type Err = std::convert::Infallible;

    /// `latest`, else a checkpoint's path.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(match text {
            "latest" => ResumeFrom::Latest,
            path => ResumeFrom::Path(path.into()),
        })
    }
}

impl ResumeFrom {
    /// The checkpoint to start from (`None`: the beginning), looked up in `store` (the
    /// run's checkpoints, if it keeps any).
    ///
    /// # Errors
    /// [`CheckpointError::Occupied`] for a fresh run whose store holds checkpoints;
    /// [`CheckpointError::Missing`] for `Latest` without a store; the store's errors.
    pub fn resolve(
        &self,
        store: Option<&CheckpointStore>,
    ) -> Result<Option<PathBuf>, CheckpointError> {
        match self {
            ResumeFrom::Fresh => match store.map(CheckpointStore::latest).transpose()?.flatten() {
                Some(latest) => Err(CheckpointError::Occupied {
                    dir: store.expect("looked up").dir().to_path_buf(),
                    latest,
                }),
                None => Ok(None),
            },
            ResumeFrom::Latest => {
                let store = store.ok_or_else(|| CheckpointError::Missing {
                    path: PathBuf::from("latest (the run keeps no checkpoints)"),
                })?;
                latest_whole(store)
            }
            ResumeFrom::Path(path) => Ok(Some(path.clone())),
        }
    }
}

/// The newest checkpoint in `store` that verifies; the newer ones skipped are said on stderr.
fn latest_whole(store: &CheckpointStore) -> Result<Option<PathBuf>, CheckpointError> {
    let Some(latest) = store.latest_whole()? else {
        return Ok(None);
    };
    for (path, why) in &latest.skipped {
        eprintln!("resume: skipping {} ({why})", path.display());
    }
    Ok(Some(latest.path))
}

/// Runs a training attempt again when it fails, up to a number of times, each from the
/// newest checkpoint of the run that verifies (or where the failed attempt started, when
/// it saved none): what a node's transient failure needs in one process. Any plan restarts
/// alike — the attempt is the caller's, given where to resume.
///
/// ```
/// use kiln_checkpoint::{CheckpointStore, Restarts};
///
/// let dir = std::env::temp_dir().join(format!("kiln-doc-restarts-{}", std::process::id()));
/// let store = CheckpointStore::new(&dir, 3);
/// let mut attempts = Vec::new();
/// let result: Result<&str, Box<dyn std::error::Error>> = Restarts::new(&store, 2).run(None, |from| {
///     attempts.push(from.map(|p| p.to_path_buf()));
///     if attempts.len() < 3 { Err("a replica failed".into()) } else { Ok("trained") }
/// });
/// assert_eq!(result.unwrap(), "trained");
/// assert_eq!(attempts, vec![None, None, None], "nothing saved: each restart from the start");
/// ```
pub struct Restarts<'a> {
    store: &'a CheckpointStore,
    max: usize,
}

impl<'a> Restarts<'a> {
    /// At most `max` restarts, from `store`'s checkpoints.
    pub fn new(store: &'a CheckpointStore, max: usize) -> Self {
        Self { store, max }
    }

    /// Runs `attempt(start)`, and after each failure `attempt(newest whole checkpoint)`,
    /// until one succeeds or `max` restarts have failed (each restart said on stderr with
    /// the failure). Returns the last attempt's result.
    ///
    /// # Errors
    /// The last attempt's error; the store's, when looking for a checkpoint fails.
    pub fn run<T, E>(
        &self,
        start: Option<PathBuf>,
        mut attempt: impl FnMut(Option<&Path>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: Display + From<CheckpointError>,
    {
        let mut from = start;
        let mut restarts = 0;
        loop {
            match attempt(from.as_deref()) {
                Ok(done) => return Ok(done),
                Err(err) if restarts < self.max => {
                    restarts += 1;
                    // The latest checkpoint of this run, else where the attempt started.
                    from = latest_whole(self.store)?.or(from);
                    eprintln!(
                        "restart {restarts} of {}: {err}; resuming from {}",
                        self.max,
                        from.as_ref()
                            .map_or("the start (no checkpoint yet)".into(), |p| p
                                .display()
                                .to_string())
                    );
                }
                Err(err) => return Err(err),
            }
        }
    }
}
