//! The dynamic program against brute force, memory limits, heterogeneous devices, errors.

use proptest::prelude::*;

use crate::{DeviceCapacity, PlanError, SegmentCost, balance_stages};

fn segment(seconds: f64, state_bytes: u64, activation_bytes: u64) -> SegmentCost {
    SegmentCost {
        seconds,
        state_bytes,
        activation_bytes,
        output_bytes: 10,
    }
}

fn device(slowdown: f64, memory: Option<u64>) -> DeviceCapacity {
    DeviceCapacity {
        slowdown,
        memory,
        in_flight: 1,
    }
}

/// Every split into `p` non-empty contiguous stages: the best feasible bottleneck.
fn brute_force(segments: &[SegmentCost], devices: &[DeviceCapacity], per_byte: f64) -> Option<f64> {
    fn splits(n: usize, p: usize) -> Vec<Vec<usize>> {
        if p == 1 {
            return vec![vec![n]];
        }
        (1..=n - (p - 1))
            .flat_map(|first| {
                splits(n - first, p - 1).into_iter().map(move |mut rest| {
                    rest.insert(0, first);
                    rest
                })
            })
            .collect()
    }
    let p = devices.len();
    splits(segments.len(), p)
        .into_iter()
        .filter_map(|sizes| {
            let mut start = 0;
            let mut bottleneck: f64 = 0.0;
            for (stage, size) in sizes.iter().enumerate() {
                let run = &segments[start..start + size];
                let d = devices[stage];
                let bytes: u64 = run
                    .iter()
                    .map(|s| s.state_bytes + d.in_flight * s.activation_bytes)
                    .sum();
                if d.memory.is_some_and(|m| bytes > m) {
                    return None;
                }
                let transfer = if stage + 1 < p {
                    run[run.len() - 1].output_bytes as f64 * per_byte
                } else {
                    0.0
                };
                let work: f64 = run.iter().map(|s| s.seconds).sum();
                bottleneck = bottleneck.max(work * d.slowdown + transfer);
                start += size;
            }
            Some(bottleneck)
        })
        .fold(None, |best: Option<f64>, b| {
            Some(best.map_or(b, |x| x.min(b)))
        })
}

fn cases() -> impl Strategy<Value = (Vec<SegmentCost>, Vec<DeviceCapacity>)> {
    (1usize..=8).prop_flat_map(|n| {
        let segments = prop::collection::vec(
            (0.1f64..10.0, 1u64..100, 0u64..50).prop_map(|(t, s, a)| segment(t, s, a)),
            n,
        );
        let devices = prop::collection::vec(
            (1.0f64..3.0, prop::option::of(40u64..400), 1u64..4).prop_map(|(slow, mem, fl)| {
                DeviceCapacity {
                    slowdown: slow,
                    memory: mem,
                    in_flight: fl,
                }
            }),
            1..=n.min(4),
        );
        (segments, devices)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_dynamic_program_finds_the_brute_force_optimum((segments, devices) in cases()) {
        let per_byte = 0.01;
        let want = brute_force(&segments, &devices, per_byte);
        match balance_stages(&segments, &devices, per_byte) {
            Ok(plan) => {
                let want = want.expect("the plan found a split, so one exists");
                prop_assert!((plan.bottleneck() - want).abs() <= 1e-9 * want.max(1.0));
                // Contiguous, non-empty, covering, and within every device's memory.
                prop_assert_eq!(plan.stages.first().map(|r| r.start), Some(0));
                prop_assert_eq!(plan.stages.last().map(|r| r.end), Some(segments.len()));
                prop_assert!(plan.stages.windows(2).all(|w| w[0].end == w[1].start));
                prop_assert!(plan.stages.iter().all(|r| !r.is_empty()));
                for (bytes, d) in plan.stage_bytes.iter().zip(&devices) {
                    prop_assert!(d.memory.is_none_or(|m| *bytes <= m));
                }
            }
            Err(PlanError::DoesNotFit { .. }) => prop_assert!(want.is_none()),
            Err(PlanError::NoSplitFits { stage_bytes, limits }) => {
                prop_assert!(want.is_none());
                // The closest split still overflows a device.
                prop_assert!(stage_bytes
                    .iter()
                    .zip(&limits)
                    .any(|(b, l)| l.is_some_and(|l| *b > l)));
            }
            Err(err) => prop_assert!(false, "unexpected {}", err),
        }
    }
}

#[test]
fn a_device_twice_as_slow_gets_half_the_work() {
    let segments = vec![segment(1.0, 1, 1); 12];
    let plan =
        balance_stages(&segments, &[device(1.0, None), device(2.0, None)], 0.0).expect("a plan");
    assert_eq!(plan.stages, vec![0..8, 8..12]);
    assert_eq!(plan.bottleneck(), 8.0);
    // Equal devices split evenly, and ties go to the earliest boundary.
    let even = balance_stages(&segments[..3], &[device(1.0, None); 2], 0.0).expect("a plan");
    assert_eq!(even.stages, vec![0..1, 1..3]);
}

#[test]
fn memory_limits_move_the_boundary_and_an_impossible_model_is_named() {
    // Each segment needs 10 bytes of state and 5 per micro-batch in flight; the first device
    // holds 3 micro-batches (1F1B's first stage of three) and 50 bytes: at most 2 segments.
    let segments = vec![segment(1.0, 10, 5); 9];
    let mut first = device(1.0, Some(50));
    first.in_flight = 3;
    let devices = [first, device(1.0, None), device(1.0, None)];
    let plan = balance_stages(&segments, &devices, 0.0).expect("a plan");
    assert_eq!(plan.stages[0], 0..2);
    assert!(plan.stage_bytes[0] <= 50);
    // A segment larger than every device: the error names it and the sizes.
    let mut big = segments.clone();
    big[4] = segment(1.0, 500, 5);
    let err = balance_stages(&big, &[device(1.0, Some(100)); 3], 0.0).expect_err("too big");
    assert_eq!(
        err,
        PlanError::DoesNotFit {
            devices: 3,
            segment: 4,
            name: "segment 4".into(),
            segment_bytes: 505,
            largest_device: 100
        }
    );
    assert!(
        err.to_string()
            .contains("largest segment (segment 4, index 4) alone needs 505 bytes")
    );
    // Every segment fits a device, but four of 25 bytes do not fit two devices of 40: the
    // error gives the closest split and the limits instead of blaming a segment.
    let err = balance_stages(&[segment(1.0, 20, 5); 4], &[device(1.0, Some(40)); 2], 0.0)
        .expect_err("no split");
    assert_eq!(
        err,
        PlanError::NoSplitFits {
            stage_bytes: vec![50, 50],
            limits: vec![Some(40), Some(40)]
        }
    );
    assert!(
        err.to_string()
            .contains("the closest needs [50 B, 50 B] against limits [40 B, 40 B]"),
        "{err}"
    );
    let shape = balance_stages(&segments[..2], &[device(1.0, None); 3], 0.0).expect_err("shape");
    assert_eq!(
        shape,
        PlanError::Shape {
            devices: 3,
            segments: 2
        }
    );
}
