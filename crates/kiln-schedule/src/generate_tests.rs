//! The generated schedules: legal, complete, deadlock-free, with the bubble and the memory
//! their papers promise.

use super::*;

/// Every legal (kind, P, M): P in 1..=6, M in 1..=16, v in 2..=4 for interleaved.
fn legal_shapes() -> Vec<(ScheduleKind, usize, usize)> {
    let mut kinds = vec![ScheduleKind::GPipe, ScheduleKind::OneFOneB];
    kinds.extend((2..=4).map(|virtual_stages| ScheduleKind::Interleaved { virtual_stages }));
    let mut shapes = Vec::new();
    for kind in kinds {
        for stages in 1..=6 {
            for micro_batches in 1..=16 {
                if kind.check(stages, micro_batches).is_ok() {
                    shapes.push((kind, stages, micro_batches));
                }
            }
        }
    }
    shapes
}

/// Where `action` sits in `stage`'s list.
fn position(schedule: &Schedule, stage: usize, action: Action) -> usize {
    let actions = schedule.actions(stage);
    actions.iter().position(|&a| a == action).unwrap()
}

#[test]
fn generated_schedules_validate_and_simulate_without_deadlock() {
    let shapes = legal_shapes();
    assert!(shapes.len() > 200, "{} shapes", shapes.len());
    for (kind, stages, micro_batches) in shapes {
        let schedule = Schedule::new(kind, stages, micro_batches).unwrap();
        assert_eq!(
            (schedule.kind(), schedule.stages(), schedule.micro_batches()),
            (kind, stages, micro_batches)
        );
        schedule.validate().unwrap();
        let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0))
            .unwrap_or_else(|e| panic!("{kind}, P={stages}, M={micro_batches}: {e}"));
        // The last virtual stage starts each micro-batch's backward from the loss of its
        // own forward, so the backward comes after the forward, in order and in time.
        let (stage, chunk) = schedule.placement(schedule.virtual_stages() - 1);
        assert_eq!(stage, stages - 1);
        for micro in 0..micro_batches {
            let forward = position(&schedule, stage, Action::Forward { micro, chunk });
            let backward = position(&schedule, stage, Action::Backward { micro, chunk });
            assert!(forward < backward, "{kind}, P={stages}, M={micro_batches}");
            let spans = timeline.spans(stage);
            assert!(spans[forward].end <= spans[backward].start);
        }
    }
}

#[test]
fn each_stage_ends_with_one_reduction_then_one_optimizer_step() {
    for (kind, stages, micro_batches) in legal_shapes() {
        let schedule = Schedule::new(kind, stages, micro_batches).unwrap();
        for stage in 0..stages {
            let actions = schedule.actions(stage);
            let tail = &actions[actions.len() - 2..];
            assert_eq!(tail, [Action::ReduceGradients, Action::OptimizerStep]);
            let counted = |wanted| actions.iter().filter(|&&a| a == wanted).count();
            assert_eq!(counted(Action::ReduceGradients), 1);
            assert_eq!(counted(Action::OptimizerStep), 1);
        }
    }
}

#[test]
fn one_f_one_b_holds_at_most_p_minus_i_micro_batches_and_gpipe_all() {
    for stages in 1..=6 {
        for micro_batches in stages..=16 {
            let schedule = one_f_one_b(stages, micro_batches).unwrap();
            let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0)).unwrap();
            for stage in 0..stages {
                let bound = micro_batches.min(stages - stage);
                assert_eq!(timeline.peak_in_flight(stage), bound);
            }
        }
        for micro_batches in 1..=16 {
            let schedule = gpipe(stages, micro_batches).unwrap();
            let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0)).unwrap();
            for stage in 0..stages {
                assert_eq!(timeline.peak_in_flight(stage), micro_batches);
            }
        }
    }
}

#[test]
fn interleaved_holds_its_warm_up_plus_one_chunk_activations() {
    // Device d runs W = (v − 1)·P + 2·(P − d − 1) warm-up forwards, then one more forward
    // before its first backward: it holds min(W + 1, v·M) (micro-batch, chunk) pairs, each
    // a 1/v share of the model's activations for a micro-batch.
    for stages in 1..=6 {
        for chunks in 2..=4 {
            for micro_batches in (stages..=16).step_by(stages) {
                let schedule = interleaved_1f1b(stages, micro_batches, chunks).unwrap();
                let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0)).unwrap();
                for stage in 0..stages {
                    let warm_up = (chunks - 1) * stages + 2 * (stages - stage - 1);
                    let bound = (warm_up + 1).min(chunks * micro_batches);
                    assert_eq!(timeline.peak_in_flight(stage), bound);
                }
            }
        }
    }
}

#[test]
fn simulated_bubble_matches_the_formula_for_uniform_costs() {
    // Exact for GPipe and 1F1B whatever the forward/backward ratio; for Megatron's
    // interleaved schedule (M a multiple of P) too, at every ratio tried here.
    let ratios = [(1.0, 1.0), (1.0, 2.0), (0.3, 1.7), (2.0, 1.0), (1.0, 10.0)];
    for (kind, stages, micro_batches) in legal_shapes() {
        let schedule = Schedule::new(kind, stages, micro_batches).unwrap();
        let formula = bubble_formula(kind, stages, micro_batches).unwrap();
        for (forward, backward) in ratios {
            let timeline = simulate(&schedule, &Costs::uniform(forward, backward)).unwrap();
            let measured = timeline.bubble_fraction();
            assert!(
                (measured - formula).abs() < 1e-9,
                "{kind}, P={stages}, M={micro_batches}, costs {forward}/{backward}: \
                 measured {measured}, formula {formula}"
            );
            // Step time = ideal + bubble: (v·M + P − 1) chunk-steps.
            let chunks = kind.chunks();
            let expected = (chunks * micro_batches + stages - 1) as f64 * (forward + backward);
            assert!((timeline.step_time() - expected).abs() < 1e-9);
            let overhead = bubble_overhead(kind, stages, micro_batches).unwrap();
            let ideal = (chunks * micro_batches) as f64 * (forward + backward);
            assert!((timeline.step_time() - ideal * (1.0 + overhead)).abs() < 1e-9);
        }
    }
}

#[test]
fn interleaving_shrinks_the_bubble_of_1f1b() {
    for stages in 2..=6 {
        for micro_batches in (stages..=16).step_by(stages) {
            let costs = Costs::uniform(1.0, 2.0);
            let plain = simulate(&one_f_one_b(stages, micro_batches).unwrap(), &costs).unwrap();
            for chunks in 2..=4 {
                let schedule = interleaved_1f1b(stages, micro_batches, chunks).unwrap();
                let interleaved = simulate(&schedule, &costs).unwrap();
                assert!(interleaved.bubble_fraction() < plain.bubble_fraction());
            }
        }
    }
}

#[test]
fn transfers_and_uneven_stages_lengthen_the_step_but_never_deadlock() {
    for (kind, stages, micro_batches) in legal_shapes() {
        let schedule = Schedule::new(kind, stages, micro_batches).unwrap();
        let count = schedule.virtual_stages();
        let forward = (0..count).map(|s| 1.0 + (s % 3) as f64).collect();
        let backward = (0..count).map(|s| 2.0 + (s % 2) as f64).collect();
        let costs = Costs::per_virtual_stage(forward, backward).with_transfer(0.25);
        let timeline = simulate(&schedule, &costs).unwrap();
        let uniform = simulate(&schedule, &Costs::uniform(1.0, 2.0)).unwrap();
        assert!(timeline.step_time() >= uniform.step_time());
        if count > 1 {
            assert!(timeline.step_time() > uniform.step_time());
        }
        for stage in 0..stages {
            assert!(timeline.busy_time(stage) <= timeline.step_time());
        }
    }
}

#[test]
fn interleaved_chunks_follow_megatron_groups_of_p() {
    // P=2, M=4, v=2, device 0: groups of 2 micro-batches go through chunk 0, then chunk 1;
    // backwards walk the chunks the other way.
    let schedule = interleaved_1f1b(2, 4, 2).unwrap();
    let order: Vec<String> = schedule
        .actions(0)
        .iter()
        .filter_map(|action| match *action {
            Action::Forward { micro, chunk } => Some(format!("F{micro}.{chunk}")),
            Action::Backward { micro, chunk } => Some(format!("B{micro}.{chunk}")),
            _ => None,
        })
        .collect();
    let expected = "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 \
                    B2.1 B3.1 B2.0 B3.0";
    assert_eq!(order.join(" "), expected);
    // Chunk 1 of device 0 is virtual stage 2: it receives from device 1 (virtual stage 1)
    // and sends to device 1 (virtual stage 3, the last).
    let actions = schedule.actions(0);
    let forward = position(&schedule, 0, Action::Forward { micro: 0, chunk: 1 });
    let recv = Action::RecvActivation {
        micro: 0,
        chunk: 1,
        from: 1,
    };
    let send = Action::SendActivation {
        micro: 0,
        chunk: 1,
        to: 1,
    };
    assert_eq!(actions[forward - 1], recv);
    assert_eq!(actions[forward + 1], send);
}

#[test]
fn a_single_stage_hands_chunks_over_without_messages() {
    let schedule = interleaved_1f1b(1, 3, 3).unwrap();
    assert!(schedule.actions(0).iter().all(|a| a.is_compute()
        || matches!(a, Action::ReduceGradients | Action::OptimizerStep)));
    let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0)).unwrap();
    assert_eq!(timeline.bubble_fraction(), 0.0);
}

#[test]
fn bad_shapes_are_refused_with_the_reason() {
    let message = |result: Result<Schedule, ScheduleError>| result.unwrap_err().to_string();
    let text = message(one_f_one_b(4, 3));
    assert!(text.contains("1F1B needs at least as many micro-batches as stages (M=3, P=4)"));
    assert!(
        text.contains("use gpipe or raise --micro-batches"),
        "{text}"
    );
    let text = message(interleaved_1f1b(4, 6, 2));
    assert!(text.contains("multiple of the stages (M=6, P=4)"), "{text}");
    assert!(text.contains("in groups of P"), "{text}");
    let text = message(interleaved_1f1b(4, 8, 1));
    assert!(
        text.contains("got 1; with one chunk per device use 1f1b"),
        "{text}"
    );
    assert!(message(interleaved_1f1b(4, 8, 0)).contains("got 0"));
    assert!(message(gpipe(0, 4)).contains("at least one stage"));
    assert!(message(gpipe(2, 0)).contains("at least one micro-batch"));
    let kind = ScheduleKind::Interleaved { virtual_stages: 2 };
    assert_eq!(
        Schedule::new(kind, 3, 4).unwrap_err(),
        ScheduleError::MicroBatchesNotMultipleOfStages {
            micro_batches: 4,
            stages: 3
        }
    );
}

#[test]
fn bad_costs_are_refused_with_the_reason() {
    let schedule = one_f_one_b(2, 2).unwrap();
    let short = Costs::per_virtual_stage(vec![1.0], vec![1.0]);
    let text = simulate(&schedule, &short).unwrap_err().to_string();
    assert!(
        text.contains("given for 1 virtual stages, the schedule has 2"),
        "{text}"
    );
    let negative = Costs::uniform(-1.0, 1.0);
    let text = simulate(&schedule, &negative).unwrap_err().to_string();
    assert!(
        text.contains("forward time of virtual stage 0 is -1"),
        "{text}"
    );
    let nan = Costs::uniform(1.0, 1.0).with_transfer(f64::NAN);
    assert!(simulate(&schedule, &nan).is_err());
}
