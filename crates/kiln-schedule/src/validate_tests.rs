//! Hand-broken schedules: the validator and the simulator name what is wrong, and where.

use proptest::prelude::*;

use super::*;

/// GPipe with P=2, M=2, whose lists are
/// stage 0: F0, send A0, F1, send A1, recv G0, B0, recv G1, B1, reduce, step;
/// stage 1: recv A0, F0, recv A1, F1, B0, send G0, B1, send G1, reduce, step.
fn gpipe_lists() -> Vec<Vec<Action>> {
    gpipe(2, 2).unwrap().into_actions()
}

fn check(kind: ScheduleKind, micro_batches: usize, lists: Vec<Vec<Action>>) -> String {
    let schedule = Schedule::from_actions(kind, micro_batches, lists);
    schedule.validate().unwrap_err().to_string()
}

fn check_gpipe(lists: Vec<Vec<Action>>) -> String {
    check(ScheduleKind::GPipe, 2, lists)
}

#[test]
fn the_sketched_lists_are_what_gpipe_generates() {
    let lists = gpipe_lists();
    assert_eq!(
        lists[0][1],
        Action::SendActivation {
            micro: 0,
            chunk: 0,
            to: 1
        }
    );
    assert_eq!(
        lists[0][4],
        Action::RecvGradient {
            micro: 0,
            chunk: 0,
            from: 1
        }
    );
    assert_eq!(
        lists[1][2],
        Action::RecvActivation {
            micro: 1,
            chunk: 0,
            from: 0
        }
    );
    assert_eq!(
        lists[1][5],
        Action::SendGradient {
            micro: 0,
            chunk: 0,
            to: 0
        }
    );
}

#[test]
fn a_missing_receive_names_the_send_left_without_one() {
    let mut lists = gpipe_lists();
    lists[1].remove(2);
    assert_eq!(
        check_gpipe(lists),
        "stage 0, action 3 (send activation of micro-batch 1 to stage 1): no matching receive \
         on stage 1"
    );
}

#[test]
fn a_missing_send_names_the_receive_left_without_one() {
    let mut lists = gpipe_lists();
    lists[0].remove(3);
    assert_eq!(
        check_gpipe(lists),
        "stage 1, action 2 (recv activation of micro-batch 1 from stage 0): no matching send \
         on stage 0"
    );
}

#[test]
fn a_duplicated_send_has_no_receive() {
    let mut lists = gpipe_lists();
    let send = lists[0][1];
    lists[0].insert(2, send);
    assert_eq!(
        check_gpipe(lists),
        "stage 0, action 2 (send activation of micro-batch 0 to stage 1): no matching receive \
         on stage 1 (it is already sent at stage 0, action 1)"
    );
}

#[test]
fn a_backward_before_its_forward_is_refused() {
    // 1F1B, P=2, M=2, stage 1: recv A0, F0, B0, send G0, ...; swap F0 and B0.
    let mut lists = one_f_one_b(2, 2).unwrap().into_actions();
    lists[1].swap(1, 2);
    assert_eq!(
        check(ScheduleKind::OneFOneB, 2, lists),
        "stage 1, action 1 (backward of micro-batch 0): runs before the forward of \
         micro-batch 0 on this stage"
    );
}

#[test]
fn a_duplicated_forward_is_refused() {
    let mut lists = gpipe_lists();
    lists[0].insert(1, Action::Forward { micro: 0, chunk: 0 });
    assert_eq!(
        check_gpipe(lists),
        "stage 0, action 1 (forward of micro-batch 0): forwarded twice (first at action 0)"
    );
}

#[test]
fn a_missing_backward_is_named_with_its_stage() {
    let mut lists = gpipe_lists();
    lists[0].remove(7);
    assert_eq!(
        check_gpipe(lists),
        "stage 0: backward of micro-batch 1 never runs"
    );
}

#[test]
fn a_forward_before_its_input_arrives_is_refused() {
    let mut lists = gpipe_lists();
    lists[1].swap(2, 3);
    assert_eq!(
        check_gpipe(lists),
        "stage 1, action 2 (forward of micro-batch 1): its input activation has not been \
         received: no recv activation of micro-batch 1 from stage 0 comes before it"
    );
}

#[test]
fn a_send_before_the_compute_producing_it_is_refused() {
    let mut lists = gpipe_lists();
    lists[0].swap(0, 1);
    assert_eq!(
        check_gpipe(lists),
        "stage 0, action 0 (send activation of micro-batch 0 to stage 1): comes before the \
         forward that produces it"
    );
}

#[test]
fn the_end_of_step_actions_come_once_and_in_order() {
    let mut lists = gpipe_lists();
    lists[0].swap(8, 9);
    assert_eq!(
        check_gpipe(lists),
        "stage 0, action 8 (optimizer step): runs before reduce gradients: it would apply \
         unreduced gradients"
    );
    let mut lists = gpipe_lists();
    lists[1].insert(6, Action::ReduceGradients);
    assert_eq!(
        check_gpipe(lists),
        "stage 1, action 7 (backward of micro-batch 1): runs after reduce gradients (action \
         6): all compute must finish before the gradients are reduced"
    );
    let mut lists = gpipe_lists();
    lists[1].insert(9, Action::ReduceGradients);
    assert_eq!(
        check_gpipe(lists),
        "stage 1, action 9 (reduce gradients): runs twice (first at action 8)"
    );
    let mut lists = gpipe_lists();
    lists[1].pop();
    assert_eq!(check_gpipe(lists), "stage 1: optimizer step never runs");
}

#[test]
fn messages_name_the_right_peer_and_stay_inside_the_pipeline() {
    let mut lists = gpipe_lists();
    lists[0][1] = Action::SendActivation {
        micro: 0,
        chunk: 0,
        to: 5,
    };
    assert_eq!(
        check_gpipe(lists),
        "stage 0, action 1 (send activation of micro-batch 0 to stage 5): virtual stage 1, at \
         the other end, is on stage 1, not stage 5"
    );
    let mut lists = gpipe_lists();
    lists[0].insert(
        0,
        Action::RecvActivation {
            micro: 0,
            chunk: 0,
            from: 1,
        },
    );
    let text = check_gpipe(lists);
    assert!(
        text.ends_with("reads the micro-batch and receives no activation"),
        "{text}"
    );
    let mut lists = gpipe_lists();
    lists[0][0] = Action::Forward { micro: 9, chunk: 0 };
    let text = check_gpipe(lists);
    assert!(text.ends_with("micro-batch 9 is out of range: the step has 2 micro-batches"));
    // One stage, two chunks: the hand-over from chunk 0 to chunk 1 is not a message.
    let kind = ScheduleKind::Interleaved { virtual_stages: 2 };
    let mut lists = interleaved_1f1b(1, 1, 2).unwrap().into_actions();
    lists[0].insert(
        1,
        Action::SendActivation {
            micro: 0,
            chunk: 0,
            to: 0,
        },
    );
    let text = check(kind, 1, lists);
    assert!(
        text.ends_with(
            "is on this same stage: hand-overs between chunks of one stage are not messages"
        ),
        "{text}"
    );
}

#[test]
fn hand_made_schedules_are_held_to_their_kind() {
    let text = check(ScheduleKind::GPipe, 2, Vec::new());
    assert_eq!(text, "a pipeline needs at least one stage (got 0)");
    let text = check(
        ScheduleKind::OneFOneB,
        1,
        gpipe(2, 1).unwrap().into_actions(),
    );
    assert!(
        text.starts_with("1F1B needs at least as many micro-batches"),
        "{text}"
    );
}

#[test]
fn two_stages_waiting_for_each_other_deadlock_and_are_both_named() {
    // Locally valid, but stage 0 waits for micro-batch 0's gradient before the forward that
    // would let stage 1 compute it.
    let recv_gradient = Action::RecvGradient {
        micro: 0,
        chunk: 0,
        from: 1,
    };
    let recv_activation = Action::RecvActivation {
        micro: 0,
        chunk: 0,
        from: 0,
    };
    let lists = vec![
        vec![
            recv_gradient,
            Action::Forward { micro: 0, chunk: 0 },
            Action::SendActivation {
                micro: 0,
                chunk: 0,
                to: 1,
            },
            Action::Backward { micro: 0, chunk: 0 },
            Action::ReduceGradients,
            Action::OptimizerStep,
        ],
        vec![
            recv_activation,
            Action::Forward { micro: 0, chunk: 0 },
            Action::Backward { micro: 0, chunk: 0 },
            Action::SendGradient {
                micro: 0,
                chunk: 0,
                to: 0,
            },
            Action::ReduceGradients,
            Action::OptimizerStep,
        ],
    ];
    let schedule = Schedule::from_actions(ScheduleKind::GPipe, 1, lists);
    schedule.validate().unwrap();
    let error = simulate(&schedule, &Costs::uniform(1.0, 2.0)).unwrap_err();
    let blocked = vec![
        BlockedAction {
            stage: 0,
            index: 0,
            action: recv_gradient,
        },
        BlockedAction {
            stage: 1,
            index: 0,
            action: recv_activation,
        },
    ];
    assert_eq!(error, ScheduleError::Deadlock { blocked });
    assert_eq!(
        error.to_string(),
        "deadlock: no stage can make progress: stage 0 waits at action 0 (recv gradient of \
         micro-batch 0 from stage 1); stage 1 waits at action 0 (recv activation of \
         micro-batch 0 from stage 0)"
    );
}

/// One random edit of a stage's list.
#[derive(Debug, Clone)]
enum Edit {
    Remove(usize),
    Swap(usize, usize),
    Duplicate(usize),
    SetMicro(usize, usize),
    SetPeer(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        any::<usize>().prop_map(Edit::Remove),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::Swap(a, b)),
        any::<usize>().prop_map(Edit::Duplicate),
        (any::<usize>(), 0..20_usize).prop_map(|(a, m)| Edit::SetMicro(a, m)),
        (any::<usize>(), 0..8_usize).prop_map(|(a, p)| Edit::SetPeer(a, p)),
    ]
}

fn apply(actions: &mut Vec<Action>, edit: &Edit) {
    let len = actions.len();
    match *edit {
        Edit::Remove(at) => {
            actions.remove(at % len);
        }
        Edit::Swap(a, b) => actions.swap(a % len, b % len),
        Edit::Duplicate(at) => actions.insert(at % len, actions[at % len]),
        Edit::SetMicro(at, value) | Edit::SetPeer(at, value) => {
            let peer = matches!(edit, Edit::SetPeer(..));
            match &mut actions[at % len] {
                Action::Forward { micro, .. } | Action::Backward { micro, .. } if !peer => {
                    *micro = value
                }
                Action::SendActivation { micro, to, .. }
                | Action::SendGradient { micro, to, .. } => {
                    *(if peer { to } else { micro }) = value
                }
                Action::RecvActivation { micro, from, .. }
                | Action::RecvGradient { micro, from, .. } => {
                    *(if peer { from } else { micro }) = value
                }
                _ => {}
            }
        }
    }
}

proptest! {
    #[test]
    fn edited_schedules_are_refused_or_run_but_never_panic(
        kind in prop_oneof![
            Just(ScheduleKind::GPipe),
            Just(ScheduleKind::OneFOneB),
            Just(ScheduleKind::Interleaved { virtual_stages: 2 }),
        ],
        stages in 1..4_usize,
        groups in 1..3_usize,
        edits in proptest::collection::vec((0..4_usize, edit()), 1..4),
    ) {
        let micro_batches = stages * groups;
        let mut lists = Schedule::new(kind, stages, micro_batches).unwrap().into_actions();
        for (stage, edit) in &edits {
            apply(&mut lists[stage % stages], edit);
        }
        let schedule = Schedule::from_actions(kind, micro_batches, lists);
        let valid = schedule.validate().is_ok();
        match simulate(&schedule, &Costs::uniform(1.0, 2.0)) {
            Ok(timeline) => prop_assert!(valid && timeline.step_time() > 0.0),
            Err(ScheduleError::Deadlock { blocked }) => prop_assert!(valid && !blocked.is_empty()),
            Err(error) => {
                prop_assert!(!valid);
                prop_assert_eq!(Some(error), schedule.validate().err());
            }
        }
    }
}
