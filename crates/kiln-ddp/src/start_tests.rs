//! Replicas agree on the step they start at: a run whose replicas would resume from
//! different checkpoints is refused on every replica before any step, exactly (steps past
//! f32's 2^24 included), and replicas at the same step train on.

use std::time::Duration;

use burn::tensor::Device;
use kiln_data::DataLoader;
use kiln_train::{TrainError, TrainPosition, Trainer};

use crate::test_support::{TinyNet, data, optimizer};
use crate::{DataParallel, DdpConfig, DdpError};

/// Two replicas starting at `steps[rank]` (epoch 0) for two more steps: the steps each ran.
fn start_at(steps: [usize; 2]) -> Result<Vec<usize>, DdpError> {
    DataParallel::new(vec![Device::flex(); 2])
        .config(DdpConfig {
            timeout: Duration::from_secs(60),
            ..DdpConfig::default()
        })
        .run(move |replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(TinyNet::new(&device))?;
            let loader = DataLoader::builder(data())
                .batch_size(4)
                .shard(replica.rank(), replica.world_size())
                .device(device)
                .build();
            let step = steps[replica.rank()];
            let (_, report) = Trainer::builder(model, optimizer())
                .gradient_step(replica.non_overlapped_step())
                .train_loader(loader)
                .resume_at(TrainPosition {
                    step,
                    epoch: 0,
                    step_in_epoch: step,
                })
                .max_steps(step + 2)
                .progress(false)
                .log_epochs(false)
                .build()?
                .fit()?;
            Ok(report.steps.len())
        })
}

#[test]
fn replicas_starting_at_different_steps_are_refused_exactly() {
    // 2^24 + 1 rounds to 2^24 in f32: an f32 check would call these equal.
    let (low, high) = (1 << 24, (1 << 24) + 1);
    match start_at([low, high]) {
        Err(DdpError::Replica {
            source: TrainError::Checkpoint(cause),
            ..
        }) => {
            let message = cause.to_string();
            assert!(
                message.contains(&format!("different steps ({low} to {high})")),
                "{message}"
            );
        }
        other => panic!("expected the start to be refused, got {other:?}"),
    }
    // The control: the same start on both trains.
    let steps = start_at([3, 3]).expect("replicas at one step train");
    assert_eq!(steps, vec![2, 2]);
}
