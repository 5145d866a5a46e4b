//! Writing a checkpoint changes nothing: two replicas with per-replica batch norm that
//! checkpoint mid-epoch end bit for bit like the same run without checkpoints, running
//! statistics included. (They averaged the replicas' statistics only at evaluations and
//! checkpoints; a checkpoint mid-epoch took that mean earlier, which moved its rounding, so
//! a run resumed from a SIGTERM checkpoint could end a few ulps off the uninterrupted one.)

use burn::tensor::Device;
use kiln_core::{FlatLayout, fingerprint, param_infos, read_params};
use kiln_data::{DataLoader, SyntheticImages};
use kiln_ddp::{DataParallel, DdpConfig};
use kiln_train::{LrSchedule, Trainer};

use crate::elastic_tests::{model, scratch, sgd};
use crate::{CheckpointStore, Checkpointer, RunIdentity};

/// Samples per replica and step; 4 steps an epoch on 2 replicas.
const BATCH: usize = 8;
const STEPS: usize = 7;

/// Rank 0's fingerprint (parameters and buffers) and running statistics after `STEPS` steps
/// of `shards` replicas' worth of data on `replicas` replicas (one replica on two shards'
/// data takes shard 0 only), checkpointing every `every` steps when given.
fn run(replicas: usize, shards: usize, every: Option<usize>) -> (u64, Vec<f32>) {
    let data = SyntheticImages::new(2 * BATCH * 4, 4, 8, [3, 8, 8]);
    let dir = every.map(|every| scratch(&format!("neutral-{every}")));
    let config = DdpConfig {
        sync_batch_norm: false,
        ..DdpConfig::default()
    };
    let results = DataParallel::new(vec![Device::flex(); replicas])
        .config(config)
        .run(|replica| {
            let device = replica.train_device();
            let model = replica.broadcast_module(model(&device))?;
            let loader = DataLoader::builder(data.clone())
                .batch_size(BATCH)
                .shuffle(5)
                .drop_last(true)
                .shard(replica.rank(), shards)
                .device(device)
                .build();
            let mut builder = Trainer::builder(model, sgd())
                .gradient_step(replica.overlapped_step())
                .schedule(LrSchedule::constant(0.05))
                .train_loader(loader)
                .max_steps(STEPS)
                .progress(false)
                .log_epochs(false);
            if let (Some(dir), Some(every)) = (&dir, every) {
                let identity = RunIdentity::new("resnet18 width 2");
                builder = builder.checkpoint(
                    Checkpointer::new(CheckpointStore::new(dir, 2), every, identity)
                        .writes(replica.rank() == 0),
                );
            }
            let (model, _) = builder.build()?.fit()?;
            let layout = FlatLayout::new(param_infos(&model).into_iter().filter(|i| !i.trainable));
            Ok((fingerprint(&model), read_params(&model, &layout)))
        })
        .unwrap();
    if let Some(dir) = dir {
        std::fs::remove_dir_all(dir).ok();
    }
    results.into_iter().next().expect("rank 0")
}

#[test]
fn checkpoints_mid_epoch_leave_a_two_replica_run_bit_for_bit_unchanged() {
    let (plain, plain_stats) = run(2, 2, None);
    // Steps 3 and 6 of 4-step epochs: both mid-epoch.
    let (checkpointed, _) = run(2, 2, Some(3));
    assert_eq!(
        plain, checkpointed,
        "checkpoints every 3 steps changed the run (fingerprints differ)"
    );
    // The control: rank 0's statistics are the replicas' mean, not what its own shard gave
    // (so there was something for a checkpoint's averaging to move).
    let (_, own_stats) = run(1, 2, None);
    assert_ne!(
        plain_stats, own_stats,
        "the replicas' statistics were never averaged"
    );
}
