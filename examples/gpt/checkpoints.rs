//! What a checkpoint of this run is, for it to refuse another run's: the run is saved and
//! resumed under any plan (a pipeline's checkpoint resumes data parallel and back: it is one
//! format) through kiln's `RunOptions` (`--run-dir`, `--checkpoint-every`, `--resume`, ...).

use kiln::checkpoint::RunIdentity;

use crate::Args;

/// Tokens of the byte-level tokenizer: a token is a byte's value.
pub const BYTE_VOCABULARY: usize = 256;

/// What the run is, for a checkpoint to refuse another run's: the model, its tokenizer and
/// vocabulary (written into the manifest with the weights, so a checkpoint says how to read
/// its tokens), its text, its optimizer schedule and precision (the plan is not part of it:
/// any plan resumes it).
pub fn identity(args: &Args, text: &str) -> RunIdentity {
    let identity = RunIdentity::new("kiln gpt, byte-level")
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
        .with("amp", format!("{:?}", args.step.amp));
    // Named only when given, so checkpoints of runs from before `--accumulation` resume.
    match args.step.accumulation {
        1 => identity,
        batches => identity.with("accumulation", batches),
    }
}
