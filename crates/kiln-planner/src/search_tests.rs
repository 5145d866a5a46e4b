//! The cost model and the search on made-up profiles whose right answer is known.

use kiln_schedule::ScheduleKind;

use crate::{
    BatchProfile, Fixed, Interconnect, Layout, ModelProfile, Plan, PlanChoice, PlanDevice,
    PlanError, PlanRequest, ProfileKey, SegmentProfile, Workload, choose_plan,
};

pub(crate) const MB: u64 = 1_000_000;

/// `segments` equal segments: per sample 1 ms forward and 2 ms backward, `params` trainable
/// bytes each, 1 MB of kept activations and 0.1 MB of output per sample; profiled at
/// batches 8 and 32 (times exactly proportional to the batch).
pub(crate) fn profile(segments: usize, params: u64, activations_measured: bool) -> ModelProfile {
    let at = |batch: usize| BatchProfile {
        batch,
        segments: (0..segments)
            .map(|i| SegmentProfile {
                name: format!("s{i}"),
                forward_seconds: 1e-3 * batch as f64,
                backward_seconds: 2e-3 * batch as f64,
                trainable_bytes: params,
                buffer_bytes: 0,
                output_bytes: MB / 10 * batch as u64,
                activation_bytes: activations_measured.then_some(MB * batch as u64),
            })
            .collect(),
    };
    ModelProfile {
        key: ProfileKey {
            model: "fake".into(),
            device: "cpu".into(),
            machine: "test".into(),
            precision: "f32".into(),
            optimizer: "sgd-momentum".into(),
            threads: 1,
            batches: vec![8, 32],
            kiln: "test".into(),
            gradient_checkpointing: false,
        },
        batches: vec![at(8), at(32)],
        update_seconds_per_byte: 0.0,
    }
}

pub(crate) fn devices(n: usize, memory: Option<u64>) -> Vec<PlanDevice> {
    (0..n)
        .map(|i| PlanDevice {
            name: format!("cpu:{i}"),
            slowdown: 1.0,
            memory,
        })
        .collect()
}

/// All-reduce at 1 GB/s with 50 µs per bucket; stages share memory.
pub(crate) const CHEAP: Interconnect = Interconnect {
    all_reduce_latency: 5e-5,
    all_reduce_seconds_per_byte: 1e-9,
    transfer_seconds_per_byte: 0.0,
};

/// SGD with momentum: one state value per parameter.
pub(crate) fn workload(global_batch: usize) -> Workload {
    Workload {
        global_batch,
        optimizer_state_factor: 1.0,
    }
}

fn auto(
    profile: &ModelProfile,
    devices: &[PlanDevice],
    net: &Interconnect,
    batch: usize,
) -> Result<PlanChoice, PlanError> {
    choose_plan(
        profile,
        devices,
        net,
        &workload(batch),
        &PlanRequest::Auto,
        Fixed::default(),
    )
}

#[test]
fn data_parallel_wins_when_a_replica_fits_and_communication_is_cheap() {
    let choice = auto(&profile(8, MB, true), &devices(2, None), &CHEAP, 64).unwrap();
    assert_eq!(choice.chosen.summary(), "dp=2");
    let Layout::DataParallel { batches } = &choice.chosen.layout else {
        unreachable!()
    };
    assert_eq!(batches, &vec![32, 32], "equal devices, equal shares");
    // 8 segments x 3 ms/sample x 32 samples, plus at most one bucket's all-reduce.
    let step = choice.chosen.predicted.step_seconds;
    assert!((0.768..0.770).contains(&step), "{step}");
    let runner_up = choice.runner_up.expect("a pipeline fits too");
    assert!(
        runner_up.summary().starts_with("pp=2"),
        "{}",
        runner_up.summary()
    );
    assert!(runner_up.predicted.step_seconds > step);
    assert!(choice.considered >= 4);
}

#[test]
fn a_pipeline_wins_when_no_replica_fits() {
    let model = profile(8, MB, true);
    // A full replica at 32 samples keeps 8 x 32 MB of activations; a 1F1B stage of 4
    // segments with two micro-batches of 8 in flight keeps 4 x 2 x 8 MB.
    let choice = auto(&model, &devices(2, Some(200 * MB)), &CHEAP, 64).unwrap();
    assert!(
        choice.chosen.summary().starts_with("pp=2 1f1b"),
        "{}",
        choice.chosen.summary()
    );
    for bytes in &choice.chosen.predicted.device_bytes {
        assert!(bytes.unwrap() <= 200 * MB);
    }
    // The same devices without the limit run data parallel: the limit made the difference.
    let free = auto(&model, &devices(2, None), &CHEAP, 64).unwrap();
    assert_eq!(free.chosen.summary(), "dp=2");
}

#[test]
fn a_hybrid_wins_when_devices_exceed_the_useful_stages() {
    // Three segments cannot make four stages, and a whole replica (60 MB at 16 samples)
    // does not fit: two
    // pipelines of two stages.
    let choice = auto(
        &profile(3, MB, true),
        &devices(4, Some(50 * MB)),
        &CHEAP,
        64,
    )
    .unwrap();
    assert!(
        choice.chosen.summary().starts_with("dp=2,pp=2"),
        "{}",
        choice.chosen.summary()
    );
}

#[test]
fn slow_all_reduce_of_large_parameters_favours_the_pipeline() {
    // 400 MB of parameters per segment at 1 GB/s: data parallel's exposed reduction dwarfs
    // a pipeline's bubble.
    let choice = auto(&profile(8, 400 * MB, true), &devices(2, None), &CHEAP, 64).unwrap();
    assert!(
        choice.chosen.summary().starts_with("pp=2"),
        "{}",
        choice.chosen.summary()
    );
    let dp = choice.runner_up.unwrap();
    assert_eq!(dp.summary(), "dp=2");
    assert!(dp.predicted.exposed_communication_seconds > 1.0);
}

#[test]
fn a_slower_device_gets_fewer_samples_and_fewer_segments() {
    let mut devices = devices(2, None);
    devices[1].slowdown = 2.0;
    let model = profile(6, MB, true);
    let dp = choose_plan(
        &model,
        &devices,
        &CHEAP,
        &workload(60),
        &PlanRequest::DataParallel,
        Fixed::default(),
    )
    .unwrap();
    let Layout::DataParallel { batches } = &dp.chosen.layout else {
        unreachable!()
    };
    assert_eq!(batches, &vec![40, 20]);
    // A device far slower still gets a sample.
    let mut lopsided = devices.clone();
    lopsided[1].slowdown = 100.0;
    let dp = choose_plan(
        &model,
        &lopsided,
        &CHEAP,
        &workload(4),
        &PlanRequest::DataParallel,
        Fixed::default(),
    )
    .unwrap();
    let Layout::DataParallel { batches } = &dp.chosen.layout else {
        unreachable!()
    };
    assert_eq!(batches, &vec![3, 1]);
    let pp = choose_plan(
        &model,
        &devices,
        &CHEAP,
        &workload(64),
        &PlanRequest::Pipeline(2),
        Fixed {
            micro_batches: Some(8),
            schedule: None,
        },
    )
    .unwrap();
    let Layout::Pipeline { split, .. } = &pp.chosen.layout else {
        unreachable!()
    };
    assert_eq!(split, &vec![4, 2]);
}

#[test]
fn fixed_choices_are_kept() {
    let choice = choose_plan(
        &profile(8, MB, true),
        &devices(2, None),
        &CHEAP,
        &workload(64),
        &PlanRequest::Pipeline(2),
        Fixed {
            schedule: Some(ScheduleKind::GPipe),
            micro_batches: Some(16),
        },
    )
    .unwrap();
    assert_eq!(choice.chosen.summary(), "pp=2 gpipe M=16");
    assert_eq!(choice.considered, 1);
}

#[test]
fn impossible_requests_are_clear_errors() {
    let model = profile(8, MB, true);
    let ask = |devices: &[PlanDevice], request: PlanRequest| {
        choose_plan(
            &model,
            devices,
            &CHEAP,
            &workload(64),
            &request,
            Fixed::default(),
        )
        .unwrap_err()
    };
    // A forced plan over the limit names each device's predicted memory.
    let err = ask(&devices(2, Some(200 * MB)), PlanRequest::DataParallel);
    let PlanError::ForcedDoesNotFit { plan, details } = &err else {
        panic!("{err}")
    };
    assert_eq!(plan, "dp=2");
    assert!(
        details.contains("cpu:0 needs") && details.contains("of its 200.0 MB"),
        "{details}"
    );
    // Nothing fits: the largest segment and the largest device are named.
    let err = ask(&devices(2, Some(5 * MB)), PlanRequest::Auto);
    assert!(matches!(err, PlanError::DoesNotFit { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the largest device holds 5000000 bytes"),
        "{err}"
    );
    // Shapes the devices cannot take.
    let err = ask(&devices(3, None), PlanRequest::Pipeline(2));
    assert!(
        err.to_string()
            .contains("multiple of 2 devices, there are 3"),
        "{err}"
    );
    let err = ask(&devices(2, None), PlanRequest::Pipeline(9));
    assert!(matches!(err, PlanError::Request(_)), "{err}");
    // A batch too small to cut into micro-batches is said so, not blamed on memory.
    let err = choose_plan(
        &model,
        &devices(2, None),
        &CHEAP,
        &workload(1),
        &PlanRequest::Pipeline(2),
        Fixed::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("cannot be cut into 2 or more"),
        "{err}"
    );
    // A limit without measured activations cannot be honoured.
    let err = choose_plan(
        &profile(8, MB, false),
        &devices(2, Some(MB)),
        &CHEAP,
        &workload(64),
        &PlanRequest::Auto,
        Fixed::default(),
    )
    .unwrap_err();
    assert_eq!(err, PlanError::Unmeasured);
}

#[test]
fn requests_parse_and_nonsense_is_refused() {
    let parse = |s: &str| s.parse::<PlanRequest>();
    assert_eq!(parse("auto").unwrap(), PlanRequest::Auto);
    assert_eq!(parse("DP").unwrap(), PlanRequest::DataParallel);
    assert_eq!(parse("pp=3").unwrap(), PlanRequest::Pipeline(3));
    assert_eq!(
        parse("dp=2,pp=4").unwrap(),
        PlanRequest::Hybrid {
            data_parallel: 2,
            stages: 4
        }
    );
    assert!(matches!(
        parse("runs/plan.json").unwrap(),
        PlanRequest::File(_)
    ));
    for bad in ["pp=0", "pp=x", "dp=2", "fast", "dp=1,pp="] {
        let err = parse(bad).unwrap_err();
        assert!(matches!(err, PlanError::Request(_)), "{bad}: {err}");
    }
}

#[test]
fn plans_round_trip_through_json_and_refuse_other_runs() {
    let choice = auto(
        &profile(3, MB, true),
        &devices(4, Some(50 * MB)),
        &CHEAP,
        64,
    )
    .unwrap();
    let plan = choice.chosen;
    let names: Vec<String> = plan.devices.clone();
    let json = plan.to_json();
    assert_eq!(Plan::from_json(&json, "fake", &names).unwrap(), plan);
    let err = Plan::from_json(&json, "resnet50", &names).unwrap_err();
    assert!(err.to_string().contains("for model `fake`"), "{err}");
    let err = Plan::from_json(&json, "fake", &names[..2]).unwrap_err();
    assert!(err.to_string().contains("devices"), "{err}");
    assert!(Plan::from_json("{", "fake", &names).is_err());
    // A hand-edited layout that no run can take is refused, not a panic later.
    let mut broken: serde_json::Value = serde_json::from_str(&json).unwrap();
    broken["layout"]["split"] = serde_json::json!([0, 3]);
    let err = Plan::from_json(&broken.to_string(), "fake", &names).unwrap_err();
    assert!(err.to_string().contains("split [0, 3]"), "{err}");
    broken["layout"]["data_parallel"] = serde_json::json!(0);
    let err = Plan::from_json(&broken.to_string(), "fake", &names).unwrap_err();
    assert!(err.to_string().contains("0 pipelines"), "{err}");
    let table = plan.table();
    assert!(
        table.contains("s0..s0") && table.contains("cpu:0,cpu:2"),
        "{table}"
    );
}

#[test]
fn a_profile_predicts_other_batch_sizes_on_the_line_through_two() {
    let mut model = profile(2, MB, true);
    // Make batch 8 cost 10 ms and batch 32 cost 22 ms: 6 ms fixed plus 0.5 ms per sample.
    model.batches[0].segments[0].forward_seconds = 0.010;
    model.batches[1].segments[0].forward_seconds = 0.022;
    let at = |batch| model.at(batch)[0].forward;
    assert!((at(16) - 0.014).abs() < 1e-12);
    assert!((at(64) - 0.038).abs() < 1e-12, "beyond the profiled sizes");
    assert!((at(4) - 0.008).abs() < 1e-12);
    assert_eq!(model.at(16)[0].output_bytes, MB / 10 * 16);
    assert_eq!(model.at(16)[0].activation_bytes, Some(16 * MB));
}

#[test]
fn a_close_pipeline_does_not_displace_data_parallel_but_a_clear_win_does() {
    let model = profile(8, MB, true);
    let plans = |pipeline_ms: f64| {
        let net = CHEAP;
        let mut dp =
            crate::predict_data_parallel(&model, &devices(2, None), &net, &workload(64)).unwrap();
        let mut pp = crate::predict_pipeline(
            &model,
            &devices(2, None),
            &net,
            &workload(64),
            crate::PipelineShape {
                data_parallel: 1,
                stages: 2,
                micro_batches: 4,
                schedule: ScheduleKind::OneFOneB,
            },
        )
        .unwrap();
        dp.predicted.step_seconds = 0.100;
        pp.predicted.step_seconds = pipeline_ms / 1e3;
        vec![pp, dp]
    };
    // 10 % faster: within the margin, data parallel stays (and the pipeline is the
    // runner-up).
    let (chosen, runner_up) = crate::search::pick(plans(91.0));
    assert_eq!(chosen.summary(), "dp=2");
    assert!(runner_up.unwrap().summary().starts_with("pp=2"));
    // 20 % faster: the pipeline wins.
    let (chosen, _) = crate::search::pick(plans(80.0));
    assert!(chosen.summary().starts_with("pp=2"), "{}", chosen.summary());
}

#[test]
fn the_optimizer_update_ends_every_step() {
    let mut model = profile(8, MB, true);
    let plan = |model: &ModelProfile, request| {
        choose_plan(
            model,
            &devices(2, None),
            &CHEAP,
            &workload(64),
            &request,
            Fixed {
                micro_batches: Some(4),
                schedule: None,
            },
        )
        .unwrap()
        .chosen
        .predicted
        .step_seconds
    };
    let (dp, pp) = (
        plan(&model, PlanRequest::DataParallel),
        plan(&model, PlanRequest::Pipeline(2)),
    );
    // 1 ns per byte: a replica updates all 8 MB (8 ms), a stage of four segments 4 MB.
    model.update_seconds_per_byte = 1e-9;
    let dp_with = plan(&model, PlanRequest::DataParallel);
    let pp_with = plan(&model, PlanRequest::Pipeline(2));
    assert!((dp_with - dp - 0.008).abs() < 1e-9, "{dp} -> {dp_with}");
    assert!((pp_with - pp - 0.004).abs() < 1e-9, "{pp} -> {pp_with}");
}
