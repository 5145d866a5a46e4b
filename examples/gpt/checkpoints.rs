//! `--checkpoint-dir`, `--checkpoint-every`, `--resume`: the run saved and resumed, under any
//! plan (a pipeline's checkpoint resumes data parallel and back: it is one format).

use std::path::PathBuf;

use kiln::checkpoint::{CheckpointStore, Checkpointer, ResumeFrom, RunIdentity};

use crate::Args;

/// Checkpoints kept in the directory (older ones are pruned).
const KEPT: usize = 3;

/// Tokens of the byte-level tokenizer: a token is a byte's value.
pub const BYTE_VOCABULARY: usize = 256;

/// What the run is, for a checkpoint to refuse another run's: the model, its tokenizer and
/// vocabulary (written into the manifest with the weights, so a checkpoint says how to read
/// its tokens), its text, its optimizer schedule and precision (the plan is not part of it:
/// any plan resumes it).
pub fn identity(args: &Args, text: &str) -> RunIdentity {
    RunIdentity::new("kiln gpt, byte-level")
        .with("tokenizer", "bytes (a token is a byte's value)")
        .with("vocabulary", BYTE_VOCABULARY)
        .with("layers", args.layers)
        .with("heads", args.heads)
        .with("width", args.width)
        .with("context", args.context)
        .with("tied head", !args.untied)
        .with("text", text)
        .with("windows per step", args.batch_size)
        .with("lr", args.lr)
        .with("weight decay", args.weight_decay)
        .with("steps", args.steps)
        .with("seed", args.seed)
        .with("amp", format!("{:?}", args.amp))
}

/// The options checked together: saving needs both the directory and the interval, and
/// `--resume latest` a directory to look in.
pub fn check(args: &Args) -> Result<(), String> {
    match (&args.checkpoint_dir, args.checkpoint_every) {
        (Some(_), None) => {
            return Err("--checkpoint-dir needs --checkpoint-every (how often to save)".into());
        }
        (None, Some(_)) => {
            return Err("--checkpoint-every needs --checkpoint-dir (where to save)".into());
        }
        (_, Some(0)) => return Err("--checkpoint-every must be at least 1".into()),
        _ => {}
    }
    if args.resume == Some(ResumeFrom::Latest) && args.checkpoint_dir.is_none() {
        return Err("--resume latest needs --checkpoint-dir (where to look)".into());
    }
    Ok(())
}

/// The checkpoint to start from: `--resume`'s, looked up in `--checkpoint-dir`; none for a
/// fresh run (refused where checkpoints already are) or `latest` before the first.
pub fn resume_from(args: &Args) -> Result<Option<PathBuf>, String> {
    let store = args
        .checkpoint_dir
        .as_ref()
        .map(|dir| CheckpointStore::new(dir, KEPT));
    let from = args.resume.clone().unwrap_or_default();
    let resolved = from.resolve(store.as_ref()).map_err(|err| {
        format!("{err} (--resume latest continues it; or pass another --checkpoint-dir)")
    })?;
    if let Some(path) = &resolved {
        println!("resume: {}", path.display());
    } else if from == ResumeFrom::Latest {
        println!("resume: no checkpoint yet, starting fresh");
    }
    Ok(resolved)
}

/// The run's checkpointer, with `--checkpoint-dir`.
pub fn saver(args: &Args, identity: &RunIdentity) -> Option<Checkpointer> {
    let dir = args.checkpoint_dir.as_ref()?;
    let every = args.checkpoint_every.unwrap_or(0);
    Some(Checkpointer::new(
        CheckpointStore::new(dir, KEPT),
        every,
        identity.clone(),
    ))
}
