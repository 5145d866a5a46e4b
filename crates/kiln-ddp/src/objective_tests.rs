//! A model that is not an image classifier (kiln-train's segmented regression network, its
//! own batches, a mean squared error) trains data-parallel on 2 replicas exactly like
//! single-device f32 training written out by hand on the union of their samples: per tensor,
//! the parameter change within 1e-5 (the replicas' weighted gradients are summed in another
//! order than one whole-batch backward), overlapped (segment by segment) or not, and ZeRO-1;
//! replicas that skip the all-reduce miss by far.

use std::collections::HashMap;

use burn::tensor::Device;
use kiln_data::Batch;
use kiln_test_support::change_error;
use kiln_train::testing::{
    Mse, RegressionNet, Rows, by_path, reference, regression_batches, sgd, source,
};
use kiln_train::{LrSchedule, Trainer};

use kiln_amp::{MixedPrecision, Precision};

use crate::{DataParallel, DdpConfig, SyncMode};

const SEED: u64 = 11;
const BATCHES: usize = 2;
const SIZE: usize = 16;
const STEPS: usize = 5;
const LR: f64 = 0.05;
/// The same samples' gradients, summed in the same order or in an order that rounds alike.
const TOLERANCE: f32 = kiln_test_support::tolerance::SAME_ORDER;

/// `batch`'s share for `rank` of `world`: contiguous samples (the union is the batch).
fn share(batch: &Rows, rank: usize, world: usize) -> Rows {
    let per = batch.samples() / world;
    batch.slice(rank * per..(rank + 1) * per)
}

/// Every replica's trained parameters, `world` replicas with `config`.
fn replicated(world: usize, overlapped: bool, config: DdpConfig) -> Vec<HashMap<String, Vec<f32>>> {
    DataParallel::new(vec![Device::flex(); world])
        .config(config)
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(RegressionNet::new(&device, SEED))?;
            let shards = regression_batches(BATCHES, SIZE, &device)
                .iter()
                .map(|batch| share(batch, replica.rank(), replica.world_size()))
                .collect();
            let objective = Mse::default();
            let step = if overlapped {
                replica.overlapped_step_with(objective)
            } else {
                replica.non_overlapped_step_with(objective)
            };
            let (model, _) = Trainer::with_objective(model, sgd(), objective)
                .gradient_step(step)
                .schedule(LrSchedule::constant(LR))
                .train_loader(source(shards, &device))
                .max_steps(STEPS)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            Ok(by_path(&model))
        })
        .unwrap()
}

fn want() -> (HashMap<String, Vec<f32>>, HashMap<String, Vec<f32>>) {
    let device = Device::flex().autodiff();
    let batches = regression_batches(BATCHES, SIZE, &device);
    (
        by_path(&RegressionNet::new(&device, SEED)),
        reference(SEED, &batches, STEPS, LR),
    )
}

#[test]
fn two_replicas_train_a_regression_model_like_one_device() {
    let (start, want) = want();
    let runs = [
        ("overlapped", true, DdpConfig::default()),
        ("whole model", false, DdpConfig::default()),
        (
            "ZeRO-1",
            true,
            DdpConfig {
                zero1: true,
                ..DdpConfig::default()
            },
        ),
    ];
    for (name, overlapped, config) in runs {
        let replicas = replicated(2, overlapped, config);
        assert_eq!(
            replicas[0], replicas[1],
            "{name}: the replicas stay identical"
        );
        let error = change_error(&start, &want, &replicas[0]);
        println!("data parallel, {name}: {error:e}");
        assert!(
            error <= TOLERANCE,
            "{name}: relative error of the change {error:e}"
        );
    }
    // The control: replicas that never all-reduce each train on half the samples.
    let config = DdpConfig {
        mode: SyncMode::Unsynchronized,
        ..DdpConfig::default()
    };
    let alone = replicated(2, true, config);
    let error = change_error(&start, &want, &alone[0]);
    println!("data parallel, unsynchronised (control): {error:e}");
    assert!(error > TOLERANCE, "the control passed: {error:e}");
}

#[test]
fn the_objective_trains_data_parallel_in_bf16() {
    // The passes cast the objective's input and widen its output (`FloatCast`): bf16
    // replicas stay identical and follow f32 training loosely (8 bits of mantissa; measured
    // 5.2e-3 of the change, the bound 0.1).
    let (start, want) = want();
    let config = DdpConfig {
        precision: MixedPrecision::new(Precision::Bf16),
        ..DdpConfig::default()
    };
    let replicas = replicated(2, true, config);
    assert_eq!(replicas[0], replicas[1], "bf16 replicas stay identical");
    let error = change_error(&start, &want, &replicas[0]);
    println!("data parallel, bf16 against f32: {error:e}");
    assert!(error < 0.1, "bf16 strays from f32 by {error:e}");
}

/// `run_mpi` takes the MPI world only: an in-process communicator (the only kind a build
/// without `mpi` has) is refused before any replica starts, not run as a world of one.
#[test]
fn run_mpi_refuses_a_communicator_that_is_not_the_mpi_world() {
    let not_mpi = kiln_comm::InProcessGroup::new(1).build().remove(0);
    let err = DataParallel::new(vec![Device::flex()])
        .run_mpi(not_mpi, |_| -> Result<(), kiln_train::TrainError> {
            panic!("no replica may start")
        })
        .unwrap_err();
    assert!(err.to_string().contains("mpi_world"), "{err}");
}
