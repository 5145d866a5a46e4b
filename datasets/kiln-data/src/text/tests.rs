//! Text windows: next tokens, seeded offsets that do not depend on where an epoch resumes
//! or how replicas split a step, a sequential held-out cut, and clear errors for bad text.

use burn::tensor::Int;

use crate::{BatchSource, DataError, TextCorpus, TextWindows, TokenBatch};

fn values(tensor: burn::tensor::Tensor<2, Int>) -> Vec<i64> {
    tensor
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .unwrap()
}

fn corpus() -> TextCorpus {
    // Every byte value once, then again: a window's position in the text shows in its values.
    TextCorpus::from_bytes("bytes", (0..=255u8).chain(0..=255).collect::<Vec<_>>())
}

#[test]
fn targets_are_the_next_tokens_and_offsets_repeat_for_a_resumed_epoch() {
    let mut windows = TextWindows::builder(corpus())
        .context(8)
        .batch_size(4)
        .seed(3)
        .build()
        .unwrap();
    // 511 tokens after the first: 63 windows of 8, 15 batches of 4.
    assert_eq!(windows.num_batches(), 15);
    let epoch: Vec<TokenBatch> = windows.batches(1, 0).map(Result::unwrap).collect();
    for batch in &epoch {
        let (tokens, targets) = (values(batch.tokens.clone()), values(batch.targets.clone()));
        for (t, n) in tokens.iter().zip(&targets) {
            assert_eq!((t + 1) % 256, *n, "the target is the next byte");
        }
    }
    // From batch 5 on: the same batches the whole epoch gives there.
    let resumed: Vec<TokenBatch> = windows.batches(1, 5).map(Result::unwrap).collect();
    assert_eq!(resumed.len(), 10);
    for (a, b) in resumed.iter().zip(&epoch[5..]) {
        assert_eq!(values(a.tokens.clone()), values(b.tokens.clone()));
    }
    // Another epoch draws other offsets.
    let other: Vec<i64> = values(windows.batches(2, 0).next().unwrap().unwrap().tokens);
    assert_ne!(other, values(epoch[0].tokens.clone()));
}

#[test]
fn two_replicas_take_the_halves_of_one_replicas_step() {
    let one = TextWindows::builder(corpus())
        .context(8)
        .batch_size(4)
        .seed(9);
    let mut whole = one.clone().build().unwrap();
    let step: Vec<i64> = values(whole.batches(0, 2).next().unwrap().unwrap().tokens);
    let mut halves = Vec::new();
    for rank in 0..2 {
        let mut shard = one.clone().batch_size(2).shard(rank, 2).build().unwrap();
        assert_eq!(shard.num_batches(), whole.num_batches());
        halves.extend(values(shard.batches(0, 2).next().unwrap().unwrap().tokens));
    }
    assert_eq!(
        halves, step,
        "replica r takes the r-th half of the step's windows"
    );
}

#[test]
fn held_out_windows_cut_the_text_in_order_every_epoch() {
    let mut windows = TextWindows::builder(corpus())
        .context(8)
        .batch_size(2)
        .sequential()
        .build()
        .unwrap();
    let first = values(windows.batches(0, 0).next().unwrap().unwrap().tokens);
    assert_eq!(first, (0..16).collect::<Vec<i64>>());
    let again = values(windows.batches(7, 0).next().unwrap().unwrap().tokens);
    assert_eq!(again, first);
}

#[test]
fn bad_text_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let err = TextCorpus::from_file(&empty).unwrap_err();
    assert!(err.to_string().contains("the file is empty"), "{err}");
    let missing = TextCorpus::from_file(dir.path().join("none.txt")).unwrap_err();
    assert!(matches!(missing, DataError::Io { .. }), "{missing}");
    // Bytes need not be UTF-8: a byte corpus takes any file.
    let binary = dir.path().join("binary");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x80].repeat(50)).unwrap();
    assert_eq!(TextCorpus::from_file(&binary).unwrap().len(), 200);
    let short = TextCorpus::from_bytes("short", b"hello".to_vec());
    let err = TextWindows::builder(short).context(8).build().unwrap_err();
    assert!(
        err.to_string().contains("fewer than one window of 8"),
        "{err}"
    );
    let err = TextWindows::builder(corpus())
        .context(8)
        .batch_size(64)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("fewer than one batch"), "{err}");
    assert!(corpus().split(1.5).is_err());
}

#[test]
fn the_shipped_jargon_file_splits_and_has_a_unigram_baseline() {
    let corpus = TextCorpus::jargon_file();
    assert_eq!(corpus.len(), 1_681_817);
    let (train, held_out) = corpus.split(0.1).unwrap();
    assert_eq!(train.len() + held_out.len(), corpus.len());
    assert_eq!(&train.tokens()[..8], &corpus.tokens()[..8]);
    // English text in bytes: a unigram model needs about 3 nats a token (ln 256 = 5.5).
    let baseline = train.unigram_loss();
    assert!((2.5..3.6).contains(&baseline), "unigram loss {baseline}");
}
