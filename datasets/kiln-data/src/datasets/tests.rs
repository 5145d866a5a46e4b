//! The parsers accept files in the real formats and reject each corrupt variant clearly.

use std::io::Write;
use std::path::Path;

use crate::{Cifar10, DataError, ImageSource, Mnist};

fn cifar_records(labels: &[u8]) -> Vec<u8> {
    labels
        .iter()
        .flat_map(|&l| std::iter::once(l).chain((0..3072).map(move |i| (i % 251) as u8 ^ l)))
        .collect()
}

fn write_cifar(dir: &Path, per_file: &[u8]) {
    for i in 1..=5 {
        std::fs::write(
            dir.join(format!("data_batch_{i}.bin")),
            cifar_records(per_file),
        )
        .unwrap();
    }
    std::fs::write(dir.join("test_batch.bin"), cifar_records(&[9, 0])).unwrap();
    std::fs::write(
        dir.join("batches.meta.txt"),
        "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n",
    )
    .unwrap();
}

fn message(err: DataError) -> String {
    err.to_string()
}

#[test]
fn cifar_reads_real_format_files() {
    let dir = tempfile::tempdir().unwrap();
    write_cifar(dir.path(), &[3, 7, 1]);
    let train = Cifar10::train(dir.path()).unwrap();
    assert_eq!(train.len(), 15);
    assert_eq!(train.class_names().len(), 10);
    let item = train.get(4).unwrap();
    assert_eq!((item.label, item.shape), (7, [3, 32, 32]));
    assert_eq!(item.pixels[1], f32::from(1u8 ^ 7) / 255.0);
    assert_eq!(Cifar10::test(dir.path()).unwrap().get(1).unwrap().label, 0);
}

#[test]
fn cifar_rejects_missing_truncated_and_mislabelled_files() {
    let dir = tempfile::tempdir().unwrap();
    write_cifar(dir.path(), &[1, 2]);
    std::fs::remove_file(dir.path().join("data_batch_3.bin")).unwrap();
    assert!(message(Cifar10::train(dir.path()).unwrap_err()).contains("data_batch_3.bin"));

    write_cifar(dir.path(), &[1, 2]);
    let mut truncated = cifar_records(&[1, 2]);
    truncated.truncate(3073 + 100);
    std::fs::write(dir.path().join("data_batch_2.bin"), truncated).unwrap();
    let err = message(Cifar10::train(dir.path()).unwrap_err());
    assert!(
        err.contains("data_batch_2.bin") && err.contains("record 1 is truncated"),
        "{err}"
    );

    write_cifar(dir.path(), &[1, 2]);
    std::fs::write(
        dir.path().join("data_batch_4.bin"),
        cifar_records(&[1, 2, 10]),
    )
    .unwrap();
    let err = message(Cifar10::train(dir.path()).unwrap_err());
    assert!(
        err.contains("data_batch_4.bin") && err.contains("record 2") && err.contains("label 10"),
        "{err}"
    );
}

fn idx_images(count: u32, rows: u32, cols: u32, body: usize) -> Vec<u8> {
    let mut bytes = vec![0, 0, 8, 3];
    for v in [count, rows, cols] {
        bytes.extend(v.to_be_bytes());
    }
    bytes.extend((0..body).map(|i| (i % 256) as u8));
    bytes
}

fn idx_labels(labels: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 8, 1];
    bytes.extend((labels.len() as u32).to_be_bytes());
    bytes.extend(labels);
    bytes
}

#[test]
fn mnist_reads_plain_and_gzipped_idx_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("train-images-idx3-ubyte"),
        idx_images(3, 28, 28, 3 * 784),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("train-labels-idx1-ubyte"),
        idx_labels(&[5, 0, 9]),
    )
    .unwrap();
    let train = Mnist::train(dir.path()).unwrap();
    assert_eq!(train.len(), 3);
    let item = train.get(2).unwrap();
    assert_eq!((item.label, item.shape), (9, [1, 28, 28]));
    assert_eq!(item.pixels[0], f32::from(((2 * 784) % 256) as u8) / 255.0);

    for (name, bytes) in [
        ("t10k-images-idx3-ubyte.gz", idx_images(2, 28, 28, 2 * 784)),
        ("t10k-labels-idx1-ubyte.gz", idx_labels(&[1, 2])),
    ] {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&bytes).unwrap();
        std::fs::write(dir.path().join(name), encoder.finish().unwrap()).unwrap();
    }
    assert_eq!(Mnist::test(dir.path()).unwrap().get(1).unwrap().label, 2);
}

#[test]
fn mnist_rejects_each_corrupt_variant_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("train-images-idx3-ubyte");
    let labels = dir.path().join("train-labels-idx1-ubyte");
    let check = |image_bytes: Vec<u8>, label_bytes: Vec<u8>, file: &str, needle: &str| {
        std::fs::write(&images, image_bytes).unwrap();
        std::fs::write(&labels, label_bytes).unwrap();
        let err = message(Mnist::from_files(&images, &labels).unwrap_err());
        assert!(err.contains(file) && err.contains(needle), "{err}");
    };
    check(
        idx_images(2, 28, 28, 784),
        idx_labels(&[1, 2]),
        "train-images",
        "header promises 2 images",
    );
    check(
        vec![1, 2, 3],
        idx_labels(&[1, 2]),
        "train-images",
        "not an IDX image file",
    );
    check(
        idx_images(2, 28, 28, 2 * 784),
        idx_labels(&[1]),
        "train-labels",
        "expected 2 labels",
    );
    check(
        idx_images(2, 28, 28, 2 * 784),
        idx_labels(&[1, 12]),
        "train-labels",
        "record 1: label 12",
    );
    std::fs::remove_file(&labels).unwrap();
    let err = message(Mnist::from_files(&images, &labels).unwrap_err());
    assert!(err.contains("train-labels-idx1-ubyte"), "{err}");
}
