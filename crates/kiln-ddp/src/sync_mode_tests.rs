//! What each [`SyncMode`] does to the replicas' parameters, step by step, and the periodic
//! divergence check.
//!
//! The trainer calls `before_eval` at the end of every epoch (and of the run), and under
//! local SGD that averages all parameters. A run's final model is therefore always averaged
//! and says nothing about the periodic averaging; [`Observed`] wraps the data-parallel step
//! and records every replica's parameters after each update instead, and the runs end
//! inside an epoch (asserted).

use std::cell::RefCell;
use std::rc::Rc;

use burn::optim::SgdConfig;
use burn::tensor::Device;
use kiln_core::{ImageClassifier, fingerprint, fingerprint_values};
use kiln_data::{DataLoader, ImageBatch};
use kiln_train::{GradientStep, StepOutput, TrainError, Trainer};

use crate::test_support::*;
use crate::{DataParallel, DdpConfig, DdpError, SyncMode};

/// A replica's flattened parameters around one `after_update`.
#[derive(Debug, Clone)]
struct Snapshot {
    /// After the optimizer's update of its own gradients.
    updated: Vec<f32>,
    /// After the data-parallel step's `after_update` (e.g. a local-SGD average).
    synced: Vec<f32>,
}

/// A gradient step that records a [`Snapshot`] of every update of `inner`.
struct Observed<S> {
    inner: S,
    log: Rc<RefCell<Vec<Snapshot>>>,
}

impl<M: ImageClassifier, S: GradientStep<M>> GradientStep<M> for Observed<S> {
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<ImageBatch>,
        step: usize,
    ) -> Result<StepOutput, TrainError> {
        self.inner.gradients(model, batches, step)
    }

    fn after_update(&mut self, model: M, step: usize) -> Result<M, TrainError> {
        let updated = params(&model).concat();
        let model = self.inner.after_update(model, step)?;
        let synced = params(&model).concat();
        self.log.borrow_mut().push(Snapshot { updated, synced });
        Ok(model)
    }

    fn before_eval(&mut self, model: M) -> Result<M, TrainError> {
        self.inner.before_eval(model)
    }
}

/// What one replica of [`observe`] returns: its snapshots, final parameters and epochs run.
struct Observation {
    log: Vec<Snapshot>,
    /// Per tensor, as [`params`] lists them.
    last: Vec<Vec<f32>>,
    epochs: usize,
}

/// Trains 2 replicas (different shards, identical start) for `steps` plain-SGD steps in
/// `mode`, recording every update.
fn observe(mode: SyncMode, steps: usize) -> Vec<Observation> {
    DataParallel::new(vec![Device::flex(); 2])
        .config(DdpConfig {
            mode,
            ..DdpConfig::default()
        })
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(TinyNet::new(&device))?;
            let loader = DataLoader::builder(data())
                .batch_size(4)
                .shard(replica.rank(), 2)
                .device(device)
                .build();
            let log = Rc::default();
            let step = Observed {
                inner: replica.overlapped_step(),
                log: Rc::clone(&log),
            };
            let (model, report) = Trainer::builder(model, SgdConfig::new().init())
                .gradient_step(step)
                .schedule(kiln_train::LrSchedule::constant(0.2))
                .train_loader(loader)
                .max_steps(steps)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            Ok(Observation {
                log: log.take(),
                last: params(&model),
                epochs: report.epochs.len(),
            })
        })
        .unwrap()
}

/// The element-wise mean of two replicas' parameters.
fn mean(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| (x + y) / 2.0).collect()
}

/// Asserts `got` equals `want` to rounding (the all-reduce's mean may round differently).
fn assert_mean(got: &[f32], want: &[f32], what: &str) {
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1e-3))
        .fold(0.0f32, |m, e| if e.is_nan() || e > m { e } else { m });
    assert!(
        worst <= 1e-6,
        "{what}: not the mean, relative error {worst:e}"
    );
}

#[test]
fn local_sgd_averages_parameters_exactly_at_period_boundaries() {
    const PERIOD: usize = 3;
    // Two boundaries (after steps 2 and 5), then one step inside the third period.
    let steps = 2 * PERIOD + 1;
    let replicas = observe(SyncMode::LocalSgd { period: PERIOD }, steps);
    for replica in &replicas {
        assert_eq!(replica.log.len(), steps);
        assert_eq!(
            replica.epochs, 1,
            "the run must end inside one epoch (30 steps)"
        );
    }
    let (a, b) = (&replicas[0].log, &replicas[1].log);
    let start = params(&TinyNet::new(&Device::flex())).concat();
    for step in 0..steps {
        let (a, b) = (&a[step], &b[step]);
        // Different shards: every update of its own makes the replicas differ.
        assert_ne!(a.updated, b.updated, "step {step}: own updates");
        assert_ne!(a.updated, start, "step {step}: no update");
        if (step + 1) % PERIOD == 0 {
            // Right after step k·period: identical, and the mean of their own updates.
            assert_eq!(
                fingerprint_values(&a.synced),
                fingerprint_values(&b.synced),
                "step {step}: not averaged at the boundary"
            );
            assert_mean(
                &a.synced,
                &mean(&a.updated, &b.updated),
                &format!("step {step}"),
            );
        } else {
            // Inside a period nothing is exchanged.
            assert_eq!(a.synced, a.updated, "step {step}: rank 0 synchronised");
            assert_eq!(b.synced, b.updated, "step {step}: rank 1 synchronised");
            assert_ne!(
                fingerprint_values(&a.synced),
                fingerprint_values(&b.synced),
                "step {step}: replicas identical inside a period"
            );
        }
    }
    // The end of the run (inside a period) averages them once more, in `before_eval`.
    let (last_a, last_b) = (&a[steps - 1].synced, &b[steps - 1].synced);
    assert_eq!(replicas[0].last, replicas[1].last, "end of run");
    assert_mean(
        &replicas[0].last.concat(),
        &mean(last_a, last_b),
        "end of run",
    );
}

#[test]
fn local_sgd_averaging_every_step_equals_synchronous_plain_sgd() {
    // With plain SGD the update is linear in the gradient, so averaging parameters after every
    // local step is the same as averaging gradients.
    let synchronous = observe(SyncMode::Gradients, STEPS);
    let local: Vec<_> = observe(SyncMode::LocalSgd { period: 1 }, STEPS)
        .into_iter()
        .map(|r| r.last)
        .collect();
    let start = params(&TinyNet::new(&Device::flex()));
    assert_close_from(
        &local,
        &synchronous[0].last,
        &start,
        REORDERED,
        "local SGD, period 1",
    );
}

#[test]
fn unsynchronized_replicas_each_train_only_on_their_own_shard() {
    let mut setup = Setup::new(2, 4);
    setup.config.mode = SyncMode::Unsynchronized;
    let replicas = replicated(&setup);
    assert_ne!(
        fingerprint_values(&replicas[0].concat()),
        fingerprint_values(&replicas[1].concat()),
        "unsynchronised replicas with different data must end different"
    );
    // Each replica is one device on its own shard's batches, in the same order.
    for (rank, got) in replicas.iter().enumerate() {
        let order = DataLoader::builder(data())
            .batch_size(4)
            .shuffle(4)
            .shard(rank, 2)
            .build()
            .batch_indices(0)
            .into_iter()
            .take(STEPS)
            .flatten()
            .collect();
        let source = Concatenated {
            inner: data(),
            order,
        };
        let reference = single(source, 4, 1, false);
        assert_close(
            std::slice::from_ref(got),
            &reference,
            REORDERED,
            &format!("unsynchronised rank {rank} vs its own shard"),
        );
    }
}

/// Replicas that start different (no broadcast) under `divergence_check_every: 2`, trained
/// synchronously for `steps` steps.
fn differently_initialised(steps: usize) -> Result<Vec<u64>, DdpError> {
    DataParallel::new(vec![Device::flex(); 2])
        .config(DdpConfig {
            divergence_check_every: 2,
            ..DdpConfig::default()
        })
        .run(|replica| {
            let device = replica.train_device();
            let model = TinyNet::seeded(&device, false, 11 + replica.rank() as u64);
            let loader = DataLoader::builder(data())
                .batch_size(4)
                .shard(replica.rank(), 2)
                .device(device)
                .build();
            let (model, _) = Trainer::builder(model, optimizer())
                .gradient_step(replica.overlapped_step())
                .train_loader(loader)
                .max_steps(steps)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            Ok(fingerprint(&model))
        })
}

#[test]
fn the_periodic_divergence_check_names_the_first_differing_parameter() {
    // Step 1 is not a check step: the different replicas train on.
    let fingerprints = differently_initialised(1).unwrap();
    assert_ne!(fingerprints[0], fingerprints[1]);
    // Step 2 is.
    match differently_initialised(2) {
        Err(DdpError::Replica {
            source: TrainError::Diverged(message),
            ..
        }) => assert!(
            message.contains("`stem.weight`") && message.contains("[1]"),
            "{message}"
        ),
        other => panic!("expected a divergence error, got {other:?}"),
    }
}
