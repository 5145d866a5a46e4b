//! Every collective against a serial reference, for many world sizes and lengths, plus the
//! failure modes: a panicking rank, a rank that never arrives, mismatched lengths.

use std::thread;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use proptest::prelude::*;

use crate::check_inputs::{input, reference};
use crate::{CommError, Communicator, InProcessGroup, ReduceOp};

const LENGTHS: [usize; 7] = [0, 1, 2, 7, 31, 1009, 100_003];

/// Runs `body` on every rank of a fresh group and returns the results in rank order.
fn run<R: Send + 'static>(
    world: usize,
    body: impl Fn(Communicator) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let comms = InProcessGroup::new(world)
        .timeout(Duration::from_secs(20))
        .build();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|comm| {
            let body = body.clone();
            thread::spawn(move || body(comm))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank panicked"))
        .collect()
}

#[test]
fn all_reduce_matches_serial_reference_for_every_op_world_and_length() {
    for world in 1..=8 {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            let results = run(world, move |comm| {
                LENGTHS
                    .iter()
                    .map(|&len| {
                        let mut data = input(comm.rank(), len);
                        comm.all_reduce(&mut data, op).unwrap();
                        data
                    })
                    .collect::<Vec<_>>()
            });
            for per_rank in results {
                for (data, &len) in per_rank.iter().zip(&LENGTHS) {
                    assert_eq!(
                        data,
                        &reference(world, len, op),
                        "world {world}, {op:?}, len {len}"
                    );
                }
            }
        }
    }
}

#[test]
fn half_precision_all_reduce_is_reduced_in_f32() {
    for world in [2, 3, 5] {
        let results = run(world, |comm| {
            let source = input(comm.rank(), 1009);
            let mut h: Vec<f16> = source.iter().map(|&v| f16::from_f32(v)).collect();
            let mut b: Vec<bf16> = source.iter().map(|&v| bf16::from_f32(v)).collect();
            comm.all_reduce(&mut h, ReduceOp::Sum).unwrap();
            comm.all_reduce(&mut b, ReduceOp::Mean).unwrap();
            (h, b)
        });
        let sum = reference(world, 1009, ReduceOp::Sum);
        let mean = reference(world, 1009, ReduceOp::Mean);
        for (h, b) in results {
            // Inputs are exact in both formats (multiples of 0.25 below 32); the only rounding is
            // the final narrowing: half an ulp, 2^-11 relative for f16 and 2^-8 for bf16.
            for (got, want) in h.iter().zip(&sum) {
                assert!(
                    (got.to_f32() - want).abs() <= want.abs() * 4.9e-4 + 1e-6,
                    "f16 {got} vs {want}"
                );
            }
            for (got, want) in b.iter().zip(&mean) {
                assert!(
                    (got.to_f32() - want).abs() <= want.abs() * 3.9e-3 + 1e-6,
                    "bf16 {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn broadcast_all_gather_reduce_scatter_match_reference() {
    for world in 1..=8 {
        let results = run(world, move |comm| {
            let rank = comm.rank();
            let mut out = Vec::new();
            for &len in &LENGTHS[..6] {
                let root = len % comm.world_size();
                let mut data = if rank == root {
                    input(root, len)
                } else {
                    vec![0.0; len]
                };
                comm.broadcast(&mut data, root).unwrap();
                assert_eq!(data, input(root, len), "broadcast world {world} len {len}");

                let mut gathered = vec![0.0; len * comm.world_size()];
                comm.all_gather(&input(rank, len), &mut gathered).unwrap();
                let expected: Vec<f32> =
                    (0..comm.world_size()).flat_map(|r| input(r, len)).collect();
                assert_eq!(gathered, expected, "all_gather world {world} len {len}");

                let mut part = vec![0.0; len];
                comm.reduce_scatter(
                    &input(rank, len * comm.world_size()),
                    &mut part,
                    ReduceOp::Sum,
                )
                .unwrap();
                out.push(part);
            }
            out
        });
        for (rank, parts) in results.into_iter().enumerate() {
            for (part, &len) in parts.iter().zip(&LENGTHS[..6]) {
                let full = reference(world, len * world, ReduceOp::Sum);
                assert_eq!(
                    part[..],
                    full[rank * len..(rank + 1) * len],
                    "reduce_scatter world {world} len {len}"
                );
            }
        }
    }
}

#[test]
fn send_and_recv_pass_messages_around_a_ring() {
    for world in 2..=5 {
        let results = run(world, |comm| {
            let (rank, n) = (comm.rank(), comm.world_size());
            comm.send(&input(rank, 13), (rank + 1) % n).unwrap();
            let mut got = vec![0.0f32; 13];
            comm.recv(&mut got, (rank + n - 1) % n).unwrap();
            comm.barrier().unwrap();
            got
        });
        for (rank, got) in results.into_iter().enumerate() {
            assert_eq!(got, input((rank + world - 1) % world, 13));
        }
    }
}

#[test]
fn a_panicking_rank_fails_every_other_rank_promptly() {
    let start = Instant::now();
    let comms = InProcessGroup::new(4)
        .timeout(Duration::from_secs(30))
        .build();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|comm| {
            thread::spawn(move || {
                if comm.rank() == 2 {
                    thread::sleep(Duration::from_millis(50));
                    panic!("planted failure");
                }
                let mut data = vec![1.0f32; 8];
                let first = comm.all_reduce(&mut data, ReduceOp::Sum);
                let next = comm.barrier();
                (first, next)
            })
        })
        .collect();
    for (rank, handle) in handles.into_iter().enumerate() {
        match handle.join() {
            Err(_) => assert_eq!(rank, 2),
            Ok((first, next)) => {
                assert!(
                    matches!(&first, Err(CommError::PeerLost { peer: 2, reason, .. }) if reason.contains("panicked")),
                    "rank {rank}: {first:?}"
                );
                assert!(matches!(next, Err(CommError::PeerLost { .. })));
            }
        }
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_missing_rank_times_out_instead_of_hanging() {
    let timeout = Duration::from_millis(300);
    let mut comms = InProcessGroup::new(3).timeout(timeout).build();
    let absent = comms.pop().unwrap(); // rank 2 never calls anything (but stays alive)
    let start = Instant::now();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|comm| thread::spawn(move || comm.barrier()))
        .collect();
    let errors: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap_err())
        .collect();
    let elapsed = start.elapsed();
    // Exactly one rank times out, after the full timeout; it poisons the group, so the other
    // fails with `PeerLost` naming it rather than waiting out a timeout of its own.
    let timed_out: Vec<_> = errors
        .iter()
        .filter_map(|e| match e {
            CommError::Timeout {
                op: "barrier",
                rank,
                waited,
            } => Some((*rank, *waited)),
            _ => None,
        })
        .collect();
    assert!(
        matches!(timed_out[..], [(_, waited)] if waited >= timeout),
        "{errors:?}"
    );
    let culprit = timed_out[0].0;
    assert!(
        errors.iter().any(|e| matches!(e,
            CommError::PeerLost { op: "barrier", peer, .. } if *peer == culprit)),
        "{errors:?}"
    );
    assert!(
        elapsed >= timeout && elapsed < timeout + Duration::from_secs(5),
        "the wait must be bounded by the timeout: took {elapsed:?}"
    );
    let mut buf = [0.0f32; 1];
    assert!(
        matches!(
            absent.recv(&mut buf, 0),
            Err(CommError::PeerLost { op: "recv", rank: 2, peer, .. }) if peer == culprit
        ),
        "the absent rank sees the group is gone too"
    );
}

#[test]
fn mismatched_lengths_are_an_error_on_every_rank() {
    let results = run(3, |comm| {
        let mut data = vec![1.0f32; 10 + comm.rank()];
        comm.all_reduce(&mut data, ReduceOp::Sum)
    });
    assert!(results.iter().all(Result::is_err), "{results:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn all_reduce_sum_is_exact_on_integers_for_random_lengths(len in 0usize..5000, world in 1usize..6) {
        let results = run(world, move |comm| {
            let mut data: Vec<f32> = (0..len).map(|i| ((i + comm.rank()) % 1000) as f32).collect();
            comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
            data
        });
        let expected: Vec<f32> = (0..len).map(|i| (0..world).map(|r| ((i + r) % 1000) as f32).sum()).collect();
        for data in results {
            prop_assert_eq!(&data, &expected);
        }
    }
}

#[test]
fn buffer_all_reduce_matches_serial_reference_and_interleaves_with_slices() {
    use crate::ReduceBuffer;
    for world in 1..=6 {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let results = run(world, move |comm| {
                LENGTHS
                    .iter()
                    .map(|&len| {
                        let mut buffer = ReduceBuffer::new(len, comm.world_size());
                        buffer.copy_from(&input(comm.rank(), len));
                        comm.all_reduce_buffer(&mut buffer, op).unwrap();
                        // A slice collective right after must not see stale slots.
                        let mut check = vec![1.0f32; 3];
                        comm.all_reduce(&mut check, ReduceOp::Sum).unwrap();
                        assert_eq!(check, vec![comm.world_size() as f32; 3]);
                        let mut out = vec![0.0; len];
                        buffer.copy_to(&mut out);
                        out
                    })
                    .collect::<Vec<_>>()
            });
            for per_rank in results {
                for (data, &len) in per_rank.iter().zip(&LENGTHS) {
                    assert_eq!(
                        data,
                        &reference(world, len, op),
                        "world {world}, {op:?}, len {len}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_buffer_laid_out_for_another_world_size_is_rejected() {
    let results = run(2, |comm| {
        let mut buffer = crate::ReduceBuffer::new(10, 3);
        comm.all_reduce_buffer(&mut buffer, ReduceOp::Sum)
    });
    assert!(
        results.iter().all(|r| matches!(
            r,
            Err(CommError::InvalidArgument { .. }) | Err(CommError::PeerLost { .. })
        )),
        "{results:?}"
    );
}

/// The caller's buffer after a failed `all_reduce_buffer` holds its own values, in its own
/// layout, whether a peer never joined (a timeout) or aborted the group.
#[test]
fn a_failed_buffer_all_reduce_hands_back_the_callers_own_values() {
    use crate::ReduceBuffer;
    const LEN: usize = 1009;
    for abort in [false, true] {
        let comms = InProcessGroup::new(2)
            .timeout(Duration::from_millis(200))
            .build();
        // A first reduction succeeds, so the failed one starts where a training loop would:
        // with the group holding spare allocations left by earlier reductions.
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                thread::spawn(move || {
                    let mut buffer = ReduceBuffer::new(LEN, 2);
                    buffer.copy_from(&input(comm.rank(), LEN));
                    comm.all_reduce_buffer(&mut buffer, ReduceOp::Sum).unwrap();
                    assert_eq!(buffer.to_vec(), reference(2, LEN, ReduceOp::Sum));
                    comm
                })
            })
            .collect();
        let mut comms: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let peer = comms.pop().unwrap(); // rank 1: stays alive, never joins the next one
        let comm = comms.pop().unwrap();
        if abort {
            peer.abort("planted abort");
        }

        let original = input(7, LEN);
        let mut buffer = ReduceBuffer::new(LEN, 2);
        buffer.copy_from(&original);
        let start = Instant::now();
        let err = comm
            .all_reduce_buffer(&mut buffer, ReduceOp::Sum)
            .unwrap_err();
        if abort {
            let planted = |reason: &str| reason == "planted abort";
            assert!(
                matches!(&err, CommError::PeerLost { peer: 1, reason, .. } if planted(reason)),
                "{err:?}"
            );
        } else {
            assert!(
                matches!(
                    err,
                    CommError::Timeout {
                        op: "all_reduce_buffer",
                        rank: 0,
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{err:?}");
        assert_eq!(buffer.to_vec(), original, "abort {abort}: {err:?}");
        for (range, chunk) in buffer.chunks() {
            assert_eq!(chunk.len(), range.len());
        }
        drop(peer);
    }
}

/// With lengths that differ between ranks, some ranks' chunks still match and get reduced
/// before the mismatch is found: every rank must still get back exactly its own values.
#[test]
fn mismatched_buffer_lengths_leave_every_buffer_intact() {
    use crate::ReduceBuffer;
    for world in 2..=4 {
        // With 4 and 5 elements over 2 ranks, chunk 0 has two elements on both: rank 0
        // reduces it, only rank 1 sees a mismatch.
        let results = run(world, |comm| {
            let len = 4 + comm.rank();
            let mut buffer = ReduceBuffer::new(len, comm.world_size());
            buffer.copy_from(&input(comm.rank(), len));
            let result = comm.all_reduce_buffer(&mut buffer, ReduceOp::Sum);
            (result, buffer.to_vec())
        });
        for (rank, (result, values)) in results.into_iter().enumerate() {
            assert!(
                matches!(
                    result,
                    Err(CommError::InvalidArgument { .. } | CommError::PeerLost { .. })
                ),
                "world {world}, rank {rank}: {result:?}"
            );
            assert_eq!(values, input(rank, 4 + rank), "world {world}, rank {rank}");
        }
    }
}
