//! Context windows of a corpus as a [`BatchSource`] of [`TokenBatch`]es.
//!
//! Training windows start at offsets drawn per epoch from the seed (any offset, so every
//! token is a window's start in some epoch); an epoch has as many windows as fit the
//! corpus end to end. Step `b`'s global batch is windows `b·B·W .. (b+1)·B·W` of the epoch's
//! draw; replica `r` of `W` takes its `r`-th `B` of them, so the windows a step trains on do
//! not depend on the replica count's split. Held-out windows (`sequential`) are the corpus
//! cut end to end, the same every epoch.

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::RngExt;

use super::{TextCorpus, TokenBatch};
use crate::rng::derived_rng;
use crate::{BatchSource, Batches, DataError};

/// A stream of random offsets per epoch (a stream id of `derived_rng`).
const OFFSETS: u64 = 0x7465_7874; // "text"

/// Configures [`TextWindows`]; see [`TextWindows::builder`].
#[derive(Debug, Clone)]
pub struct TextWindowsBuilder {
    corpus: TextCorpus,
    context: usize,
    batch_size: usize,
    seed: u64,
    shard: (usize, usize),
    sequential: bool,
    device: Device,
}

impl TextWindowsBuilder {
    /// Tokens per window (the model's context; default 64).
    pub fn context(mut self, context: usize) -> Self {
        self.context = context;
        self
    }

    /// Windows per batch of this replica (default 16).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// The seed of every epoch's offsets (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// This replica's share: replica `rank` of `world` (default the only one).
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        self.shard = (rank, world);
        self
    }

    /// Windows cut end to end in order, the same every epoch (held-out evaluation), instead
    /// of drawn at random offsets.
    pub fn sequential(mut self) -> Self {
        self.sequential = true;
        self
    }

    /// Where batches are built (an autodiff device for training; default: Flex).
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`DataError::Config`] for a zero context or batch, a shard outside its world, or a
    /// corpus shorter than one window and its next token, or with too few windows for one
    /// batch of every replica.
    pub fn build(self) -> Result<TextWindows, DataError> {
        let (rank, world) = self.shard;
        if self.context == 0 || self.batch_size == 0 {
            return Err(DataError::Config(
                "a text window needs a context and a batch of at least 1".into(),
            ));
        }
        if world == 0 || rank >= world {
            return Err(DataError::Config(format!(
                "replica {rank} of {world}: no such shard"
            )));
        }
        let tokens = self.corpus.len();
        if tokens < self.context + 1 {
            return Err(DataError::Config(format!(
                "{} has {tokens} tokens, fewer than one window of {} and the token after it",
                self.corpus.name(),
                self.context
            )));
        }
        // Windows that fit end to end (each needs the token after it).
        let windows = (tokens - 1) / self.context;
        let batches = windows / (self.batch_size * world);
        if batches == 0 {
            return Err(DataError::Config(format!(
                "{} gives {windows} windows of {} tokens, fewer than one batch of {} for each of {world} replica(s)",
                self.corpus.name(),
                self.context,
                self.batch_size
            )));
        }
        Ok(TextWindows {
            builder: self,
            batches,
        })
    }
}

/// Context windows of a [`TextCorpus`] (byte tokens), batched: a [`BatchSource`] of
/// [`TokenBatch`]es for [`Trainer`](../kiln_train/struct.Trainer.html) and pipelines.
///
/// ```
/// use kiln_data::{BatchSource, TextCorpus, TextWindows};
///
/// let corpus = TextCorpus::from_bytes("a test", b"the quick brown fox jumps over the lazy dog. ".repeat(20));
/// let mut windows = TextWindows::builder(corpus).context(8).batch_size(4).build()?;
/// let batch = windows.batches(0, 0).next().unwrap()?;
/// assert_eq!(batch.tokens.dims(), [4, 8]);
/// # Ok::<(), kiln_data::DataError>(())
/// ```
#[derive(Debug, Clone)]
pub struct TextWindows {
    builder: TextWindowsBuilder,
    /// Batches per epoch.
    batches: usize,
}

impl TextWindows {
    /// Starts configuring windows over `corpus`.
    pub fn builder(corpus: TextCorpus) -> TextWindowsBuilder {
        TextWindowsBuilder {
            corpus,
            context: 64,
            batch_size: 16,
            seed: 0,
            shard: (0, 1),
            sequential: false,
            device: Device::flex(),
        }
    }

    /// The start of every window of `epoch`'s batch `batch` for this replica.
    fn offsets(&self, epoch: u64, batch: usize) -> Vec<usize> {
        let b = &self.builder;
        let (rank, world) = b.shard;
        let first = (batch * world + rank) * b.batch_size;
        if b.sequential {
            return (first..first + b.batch_size)
                .map(|w| w * b.context)
                .collect();
        }
        // Offsets are drawn per window from (seed, epoch, window): the same whatever batch
        // a resumed epoch starts from.
        let last_start = b.corpus.len() - b.context - 1;
        (first..first + b.batch_size)
            .map(|window| {
                let index = epoch << 32 | window as u64;
                derived_rng(b.seed, OFFSETS, index).random_range(0..=last_start)
            })
            .collect()
    }

    /// `epoch`'s batch `batch` for this replica.
    fn batch(&self, epoch: u64, batch: usize) -> TokenBatch {
        let b = &self.builder;
        let tokens = b.corpus.tokens();
        let offsets = self.offsets(epoch, batch);
        let window = |shift: usize| -> Vec<i64> {
            offsets
                .iter()
                .flat_map(|&start| tokens[start + shift..start + shift + b.context].iter())
                .map(|&byte| i64::from(byte))
                .collect()
        };
        let shape = [b.batch_size, b.context];
        let tensor = |values: Vec<i64>| {
            Tensor::<2, Int>::from_data(TensorData::new(values, shape), &b.device)
        };
        TokenBatch {
            tokens: tensor(window(0)),
            targets: tensor(window(1)),
        }
    }
}

impl BatchSource for TextWindows {
    type Batch = TokenBatch;

    fn num_batches(&self) -> usize {
        self.batches
    }

    fn batches(&mut self, epoch: u64, first: usize) -> Batches<'_, TokenBatch> {
        Box::new((first..self.batches).map(move |batch| Ok(self.batch(epoch, batch))))
    }

    fn device(&self) -> Option<&Device> {
        Some(&self.builder.device)
    }
}
