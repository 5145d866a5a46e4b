//! MNIST in the IDX format.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::read::{format_error, read_file};
use crate::{DataError, ImageItem, ImageSource};

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

/// MNIST from IDX files (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
/// `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`), each plain or gzipped (`.gz`).
#[derive(Debug, Clone)]
pub struct Mnist {
    pixels: Arc<Vec<u8>>,
    labels: Arc<Vec<u8>>,
    side: [usize; 2],
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// `dir/name`, or `dir/name.gz` when only that exists.
fn find(dir: &Path, name: &str) -> PathBuf {
    let plain = dir.join(name);
    let gz = dir.join(format!("{name}.gz"));
    if !plain.exists() && gz.exists() {
        gz
    } else {
        plain
    }
}

impl Mnist {
    /// The 60,000 training digits in `dir`.
    pub fn train(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let dir = dir.as_ref();
        Self::from_files(
            &find(dir, "train-images-idx3-ubyte"),
            &find(dir, "train-labels-idx1-ubyte"),
        )
    }

    /// The 10,000 test digits in `dir`.
    pub fn test(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let dir = dir.as_ref();
        Self::from_files(
            &find(dir, "t10k-images-idx3-ubyte"),
            &find(dir, "t10k-labels-idx1-ubyte"),
        )
    }

    /// Reads and validates an images file and its labels file.
    pub fn from_files(images: &Path, labels: &Path) -> Result<Self, DataError> {
        let image_bytes = read_file(images)?;
        if image_bytes.len() < 16 || be_u32(&image_bytes, 0) != IMAGES_MAGIC {
            return Err(format_error(
                images,
                format!(
                    "not an IDX image file (expected magic {IMAGES_MAGIC:#010x} and a 16-byte header)"
                ),
            ));
        }
        let count = be_u32(&image_bytes, 4) as usize;
        let side = [
            be_u32(&image_bytes, 8) as usize,
            be_u32(&image_bytes, 12) as usize,
        ];
        let expected = 16 + count * side[0] * side[1];
        if image_bytes.len() != expected {
            return Err(format_error(
                images,
                format!(
                    "header promises {count} images of {}×{} ({expected} bytes) but the file has {} bytes",
                    side[0],
                    side[1],
                    image_bytes.len()
                ),
            ));
        }
        let label_bytes = read_file(labels)?;
        if label_bytes.len() < 8 || be_u32(&label_bytes, 0) != LABELS_MAGIC {
            return Err(format_error(
                labels,
                format!(
                    "not an IDX label file (expected magic {LABELS_MAGIC:#010x} and an 8-byte header)"
                ),
            ));
        }
        let label_count = be_u32(&label_bytes, 4) as usize;
        if label_count != count || label_bytes.len() != 8 + count {
            return Err(format_error(
                labels,
                format!(
                    "expected {count} labels, header says {label_count}, file holds {}",
                    label_bytes.len().saturating_sub(8)
                ),
            ));
        }
        if let Some(record) = label_bytes[8..].iter().position(|&l| l > 9) {
            return Err(format_error(
                labels,
                format!(
                    "record {record}: label {} is not in 0..10",
                    label_bytes[8 + record]
                ),
            ));
        }
        Ok(Self {
            pixels: Arc::new(image_bytes[16..].to_vec()),
            labels: Arc::new(label_bytes[8..].to_vec()),
            side,
        })
    }
}

impl ImageSource for Mnist {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> Result<ImageItem, DataError> {
        let [h, w] = self.side;
        let label = *self.labels.get(index).ok_or_else(|| DataError::Item {
            index,
            detail: format!("index out of range for {} images", self.len()),
        })?;
        Ok(ImageItem::from_u8(
            &self.pixels[index * h * w..(index + 1) * h * w],
            [1, h, w],
            usize::from(label),
        ))
    }
}
