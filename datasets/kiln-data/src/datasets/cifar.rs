//! CIFAR-10 in its binary format.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::read::{format_error, read_file};
use crate::{DataError, ImageItem, ImageSource};

const SIDE: usize = 32;
const PIXELS: usize = 3 * SIDE * SIDE;
const RECORD: usize = 1 + PIXELS;
const CLASSES: usize = 10;

/// CIFAR-10 from the "binary version" directory (`data_batch_1.bin` … `data_batch_5.bin`,
/// `test_batch.bin`, `batches.meta.txt`).
///
/// Each record is one label byte followed by 3072 pixel bytes (red, green, blue planes of
/// 32×32). The files are read and validated when the set is opened; pixels stay 8-bit in
/// memory and are scaled to `[0, 1]` when a sample is read.
#[derive(Debug, Clone)]
pub struct Cifar10 {
    records: Arc<Vec<u8>>,
    class_names: Vec<String>,
}

impl Cifar10 {
    /// The 50,000 training images of `dir`.
    pub fn train(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let dir = dir.as_ref();
        Self::open(
            dir,
            (1..=5).map(|i| dir.join(format!("data_batch_{i}.bin"))),
        )
    }

    /// The 10,000 test images of `dir`.
    pub fn test(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let dir = dir.as_ref();
        Self::open(dir, std::iter::once(dir.join("test_batch.bin")))
    }

    fn open(dir: &Path, files: impl Iterator<Item = PathBuf>) -> Result<Self, DataError> {
        let mut records = Vec::new();
        for path in files {
            let bytes = read_file(&path)?;
            if bytes.is_empty() || bytes.len() % RECORD != 0 {
                return Err(format_error(
                    &path,
                    format!(
                        "{} bytes is not a whole number of {RECORD}-byte records (record {} is truncated)",
                        bytes.len(),
                        bytes.len() / RECORD
                    ),
                ));
            }
            for (record, chunk) in bytes.chunks(RECORD).enumerate() {
                if usize::from(chunk[0]) >= CLASSES {
                    return Err(format_error(
                        &path,
                        format!("record {record}: label {} is not in 0..{CLASSES}", chunk[0]),
                    ));
                }
            }
            records.extend_from_slice(&bytes);
        }
        let meta = dir.join("batches.meta.txt");
        let class_names = match std::fs::read_to_string(&meta) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            Err(source) => return Err(DataError::Io { path: meta, source }),
        };
        Ok(Self {
            records: Arc::new(records),
            class_names,
        })
    }

    /// Class names from `batches.meta.txt`.
    pub fn class_names(&self) -> &[String] {
        &self.class_names
    }
}

impl ImageSource for Cifar10 {
    fn len(&self) -> usize {
        self.records.len() / RECORD
    }

    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        let record = self
            .records
            .get(index * RECORD..(index + 1) * RECORD)
            .ok_or_else(|| DataError::Item {
                index,
                detail: format!("index out of range for {} images", self.len()),
            })?;
        Ok(ImageItem::from_u8(
            &record[1..],
            [3, SIDE, SIDE],
            usize::from(record[0]),
        ))
    }
}
