//! The memory lever: gradient checkpointing, pulled only when nothing fits without it.

use crate::search_tests::{CHEAP, MB, devices, profile, workload};
use crate::{Fixed, ModelProfile, PlanError, PlanRequest, choose_plan_with_lever};

/// The same model profiled with gradient checkpointing: `kept` of the activations kept,
/// each backward `slower` times as long (the recomputation).
fn recomputing(kept: f64, slower: f64) -> ModelProfile {
    let mut lever = profile(8, MB, true);
    lever.key.gradient_checkpointing = true;
    for batch in &mut lever.batches {
        for segment in &mut batch.segments {
            segment.activation_bytes = segment.activation_bytes.map(|a| (a as f64 * kept) as u64);
            segment.backward_seconds *= slower;
        }
    }
    lever
}

fn plan(
    memory: u64,
    request: &PlanRequest,
    lever: impl FnOnce() -> Result<ModelProfile, PlanError>,
) -> Result<crate::PlanChoice, PlanError> {
    choose_plan_with_lever(
        &profile(8, MB, true),
        lever,
        &devices(2, Some(memory)),
        &CHEAP,
        &workload(64),
        request,
        Fixed::default(),
    )
}

#[test]
fn checkpointing_is_used_only_where_nothing_fits_without_it_and_says_so() {
    // Roomy: the plain plan, and the lever's profile is never taken.
    let roomy = plan(10_000 * MB, &PlanRequest::Auto, || {
        panic!("profiled for the lever although a plan fits")
    })
    .unwrap();
    assert!(!roomy.chosen.gradient_checkpointing);
    assert_eq!(roomy.chosen.summary(), "dp=2");
    // 50 MB: a replica needs ~290 MB, the best pipeline (2 stages, 8 micro-batches) 80 MB on
    // its first stage; keeping 30 % of the activations, that stage needs ~35 MB and fits.
    let tight = plan(50 * MB, &PlanRequest::Auto, || Ok(recomputing(0.3, 1.5))).unwrap();
    assert!(tight.chosen.gradient_checkpointing);
    assert!(
        tight.chosen.summary().ends_with("+ checkpointing"),
        "{}",
        tight.chosen.summary()
    );
    assert!(tight.chosen.stages() > 1);
    let bytes = tight
        .chosen
        .predicted
        .device_bytes
        .iter()
        .flatten()
        .max()
        .copied();
    assert!(bytes.unwrap() <= 50 * MB);
    // The plan says so in JSON, and reloads with it.
    let json = tight.chosen.to_json();
    assert!(json.contains("\"gradient_checkpointing\": true"), "{json}");
}

#[test]
fn when_nothing_fits_even_recomputing_both_reasons_are_given() {
    let err = plan(10 * MB, &PlanRequest::Auto, || Ok(recomputing(0.9, 1.1))).unwrap_err();
    let PlanError::EvenRecomputing { plain, recomputing } = &err else {
        panic!("{err}");
    };
    assert!(plain.is_memory() && recomputing.is_memory(), "{err}");
    assert!(
        err.to_string().contains("with gradient checkpointing"),
        "{err}"
    );
    // Requests the lever cannot change are not retried.
    let err = plan(10 * MB, &PlanRequest::Pipeline(3), || {
        panic!("retried a request that cannot be planned")
    })
    .unwrap_err();
    assert!(matches!(err, PlanError::Request(_)), "{err}");
    // A lever profile taken without checkpointing is refused, not trusted.
    let err = plan(50 * MB, &PlanRequest::Auto, || Ok(profile(8, MB, true))).unwrap_err();
    assert!(
        err.to_string()
            .contains("not taken with gradient checkpointing"),
        "{err}"
    );
}
