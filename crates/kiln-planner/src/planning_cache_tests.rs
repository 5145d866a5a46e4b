//! A planning reads its profile back from the cache (no second profile, and says so), takes
//! a profile only for its own key, profiles again over a corrupted file and rewrites it, and
//! plans on when the cache cannot be written.

use std::cell::Cell;
use std::path::Path;

use kiln_core::DeviceSpec;

use crate::search_tests::{MB, profile};
use crate::{Fixed, PlanRequest, ProfileCache, RunPlanning};

fn planning(cache: &Path) -> RunPlanning {
    let device = |name: &str| {
        let spec = DeviceSpec::Cpu(0);
        (name.to_string(), spec, burn::tensor::Device::flex())
    };
    RunPlanning {
        model: "fake".into(),
        devices: vec![device("cpu:0"), device("cpu:1")],
        global_batch: 64,
        request: PlanRequest::Auto,
        fixed: Fixed::default(),
        memory: vec![None, None],
        threads: 1,
        optimizer: "sgd".into(),
        optimizer_state_factor: 1.0,
        profile_cache: Some(cache.to_path_buf()),
        // Nothing would be left to choose otherwise: predicting makes it profile.
        predict: true,
    }
}

/// Plans once, counting the profiles taken; returns the notes.
fn plan(planning: &RunPlanning, profiles: &Cell<usize>) -> Vec<String> {
    let planned = planning
        .choose(|_, key| {
            profiles.set(profiles.get() + 1);
            Ok(crate::ModelProfile {
                key,
                ..profile(4, MB, true)
            })
        })
        .expect("a plan");
    assert!(planned.plan.is_some());
    planned.notes
}

fn has(notes: &[String], text: &str) -> bool {
    notes.iter().any(|note| note.contains(text))
}

#[test]
fn a_cached_profile_is_read_back_for_its_own_key_only_and_a_bad_cache_never_stops_a_plan() {
    let dir = std::env::temp_dir().join(format!("kiln-planning-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache_dir = dir.join("profiles");
    let planning = planning(&cache_dir);
    let profiles = Cell::new(0);

    let first = plan(&planning, &profiles);
    assert_eq!(profiles.get(), 1);
    assert!(!has(&first, "from the cache"), "{first:#?}");
    assert!(has(&first, "planner: profiled 4 segments"), "{first:#?}");

    let second = plan(&planning, &profiles);
    assert_eq!(profiles.get(), 1, "the second plan read the cache");
    assert!(
        has(&second, "profile of cpu from the cache in"),
        "{second:#?}"
    );
    assert!(has(&second, "planner: read 4 segments"), "{second:#?}");

    // Another machine's key, or another model's, is not this run's.
    let cache = ProfileCache::new(&cache_dir);
    let stored = std::fs::read_dir(&cache_dir).unwrap().count();
    assert_eq!(stored, 1, "one file, no partial left");
    let mut key = planning.profile_key("cpu", &[8, 32]);
    assert!(cache.load(&key).unwrap().is_some());
    key.machine = "another CPU".into();
    assert!(cache.load(&key).unwrap().is_none());

    // A corrupted file is profiled over and rewritten.
    let file = std::fs::read_dir(&cache_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&file, "not json").unwrap();
    let third = plan(&planning, &profiles);
    assert_eq!(profiles.get(), 2);
    assert!(has(&third, "profiling again"), "{third:#?}");
    plan(&planning, &profiles);
    assert_eq!(profiles.get(), 2, "the rewritten file is read");

    // A cache that cannot be written: the plan goes on, and says the profile is not kept.
    let blocked = dir.join("a-file");
    std::fs::write(&blocked, "").unwrap();
    let notes = plan(&self::planning(&blocked), &profiles);
    assert_eq!(profiles.get(), 3);
    assert!(has(&notes, "the profile is not kept"), "{notes:#?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
