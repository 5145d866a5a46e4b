//! A text corpus as byte tokens (vocabulary 256).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::DataError;

/// The Jargon File 4.4.7, gzipped (public domain; see `corpora/README.md`).
const JARGON_FILE: &[u8] = include_bytes!("../../corpora/jargon-4.4.7.txt.gz");

/// A corpus of byte tokens (ids 0..256): any file is valid, UTF-8 or not.
#[derive(Debug, Clone)]
pub struct TextCorpus {
    name: String,
    bytes: Arc<[u8]>,
}

impl TextCorpus {
    /// The tokens of the shipped corpus: the Jargon File 4.4.7 (1,681,817 bytes of English
    /// text, public domain).
    ///
    /// # Panics
    /// If the crate's embedded copy does not decompress (a broken build, not an input).
    pub fn jargon_file() -> Self {
        let mut bytes = Vec::with_capacity(1_700_000);
        flate2::read::GzDecoder::new(JARGON_FILE)
            .read_to_end(&mut bytes)
            .expect("the embedded Jargon File decompresses");
        Self::from_bytes("the Jargon File 4.4.7", bytes)
    }

    /// The bytes of the file at `path`, as tokens.
    ///
    /// # Errors
    /// [`DataError::Io`] when it cannot be read; [`DataError::Format`] when it is empty.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if bytes.is_empty() {
            return Err(DataError::Format {
                path: path.to_path_buf(),
                detail: "the file is empty: there is no text to train on".into(),
            });
        }
        Ok(Self::from_bytes(path.display().to_string(), bytes))
    }

    /// `bytes` as a corpus called `name`.
    pub fn from_bytes(name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) -> Self {
        Self {
            name: name.into(),
            bytes: bytes.into(),
        }
    }

    /// Where it came from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its tokens (bytes).
    pub fn tokens(&self) -> &[u8] {
        &self.bytes
    }

    /// Tokens in it.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The corpus cut in two: the first part for training, the last `held_out` fraction
    /// (`0 < held_out < 1`) for evaluation, so no window of one overlaps the other.
    ///
    /// # Errors
    /// [`DataError::Config`] for a fraction outside `(0, 1)` or a corpus too short to cut.
    pub fn split(&self, held_out: f64) -> Result<(TextCorpus, TextCorpus), DataError> {
        if !(held_out > 0.0 && held_out < 1.0) {
            return Err(DataError::Config(format!(
                "the held-out fraction must lie between 0 and 1, got {held_out}"
            )));
        }
        let cut = ((self.len() as f64) * (1.0 - held_out)).round() as usize;
        if cut == 0 || cut == self.len() {
            return Err(DataError::Config(format!(
                "{} ({} tokens) is too short to hold out {held_out} of it",
                self.name,
                self.len()
            )));
        }
        let part = |name: &str, range: std::ops::Range<usize>| {
            Self::from_bytes(format!("{} ({name})", self.name), &self.bytes[range])
        };
        Ok((part("training", 0..cut), part("held out", cut..self.len())))
    }

    /// The loss (nats per token) of always predicting the corpus's own token frequencies:
    /// the baseline a language model must beat.
    pub fn unigram_loss(&self) -> f64 {
        let mut counts = [0usize; 256];
        for &byte in self.bytes.iter() {
            counts[usize::from(byte)] += 1;
        }
        let total = self.len().max(1) as f64;
        counts
            .iter()
            .filter(|&&count| count > 0)
            .map(|&count| {
                let p = count as f64 / total;
                -p * p.ln()
            })
            .sum()
    }
}
