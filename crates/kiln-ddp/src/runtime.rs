//! Running one replica per device.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::Device;
use kiln_comm::{CommError, CommWorker, DeviceGroup, InProcessGroup};
use kiln_core::{Forward, ImageClassifier, Segmented, panic_message};
use kiln_train::{Classification, Objective, TrainError};

use crate::consensus::{Selection, broadcast, check_divergence};
use crate::grads::GradStore;
use crate::pass::{BySegment, Pass, WholeModel};
use crate::threads::{replica_pool, resolve_threads};
use crate::{DdpConfig, DdpError, DdpStep};

/// Runs a training closure on one replica per device, in threads of this process.
///
/// ```
/// use burn::optim::SgdConfig;
/// use burn::tensor::Device;
/// use kiln_data::{DataLoader, SyntheticImages};
/// use kiln_ddp::DataParallel;
/// use kiln_resnet::{ResNetConfig, StemKind};
/// use kiln_train::Trainer;
///
/// let data = SyntheticImages::new(32, 4, 1, [3, 8, 8]);
/// let reports = DataParallel::new(vec![Device::flex(), Device::flex()])
///     .run(|replica| {
///         let device = replica.train_device();
///         let model = kiln_core::init_module(&device, 42, || {
///             ResNetConfig::resnet18(4).with_stem(StemKind::Cifar).with_base_width(2).init(&device)
///         });
///         let model = replica.broadcast_module(model)?; // identical start
///         let loader = DataLoader::builder(data.clone())
///             .batch_size(8)
///             .shard(replica.rank(), replica.world_size())
///             .device(device)
///             .build();
///         let (_model, report) = Trainer::builder(model, SgdConfig::new().init())
///             .gradient_step(replica.overlapped_step())
///             .train_loader(loader)
///             .max_steps(2)
///             .progress(false)
///             .log_epochs(false)
///             .build()?
///             .fit()?;
///         Ok(report)
///     })
///     .unwrap();
/// assert_eq!(reports.len(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct DataParallel {
    devices: Vec<Device>,
    config: DdpConfig,
}

/// What one replica's closure gets: its rank, device and communication.
#[derive(Debug)]
pub struct Replica {
    rank: usize,
    world_size: usize,
    device: Device,
    comm: Arc<CommWorker>,
    config: DdpConfig,
    /// Burn's native collective over this process's replicas, when their devices have one.
    device_group: Option<DeviceGroup>,
}

impl DataParallel {
    /// One replica per entry of `devices` (the same device may appear several times).
    pub fn new(devices: Vec<Device>) -> Self {
        Self {
            devices,
            config: DdpConfig::default(),
        }
    }

    /// Sets the options.
    pub fn config(mut self, config: DdpConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs `train` on every replica and returns their results in rank order.
    ///
    /// If a replica fails or panics, the group is aborted so that the other replicas fail at
    /// their next collective instead of waiting, and the first replica's own error (not the
    /// "peer lost" errors it caused) is returned.
    pub fn run<R, F>(&self, train: F) -> Result<Vec<R>, DdpError>
    where
        R: Send,
        F: Fn(Replica) -> Result<R, TrainError> + Sync,
    {
        if self.devices.is_empty() {
            return Err(DdpError::Config("at least one device is needed".into()));
        }
        let comms = InProcessGroup::new(self.devices.len())
            .timeout(self.config.timeout)
            .build();
        self.run_communicators(comms, true, train)
    }

    /// Runs `train` on this process's replicas of a multi-process world (`mpi` is
    /// [`Communicator::mpi_world`](kiln_comm::Communicator::mpi_world)'s): one replica per
    /// entry of this `DataParallel`'s devices, `mpi`'s processes between them (every process
    /// must list the same number of devices). Global rank = process × local replicas + local
    /// rank. Launch it under `mpirun`, one process per machine (or per socket).
    ///
    /// Present in every build (a program offering MPI needs no `cfg`): without the `mpi`
    /// feature no MPI communicator exists, and any other is refused.
    pub fn run_mpi<R, F>(&self, mpi: kiln_comm::Communicator, train: F) -> Result<Vec<R>, DdpError>
    where
        R: Send,
        F: Fn(Replica) -> Result<R, TrainError> + Sync,
    {
        if self.devices.is_empty() {
            return Err(DdpError::Config("at least one device is needed".into()));
        }
        #[cfg(feature = "mpi")]
        if let kiln_comm::Communicator::Mpi(mpi) = mpi {
            // NCCL groups of Burn's collective span one process, and this world spans several.
            return self.run_communicators(
                kiln_comm::hybrid_group(mpi, self.devices.len()),
                false,
                train,
            );
        }
        let _ = (mpi, train);
        Err(DdpError::Config(
            "run_mpi needs `Communicator::mpi_world()`'s communicator".into(),
        ))
    }

    /// Runs one replica per communicator, on the matching device, in threads; `native`:
    /// the world is this process, so Burn's collective may reduce device tensors.
    fn run_communicators<R, F>(
        &self,
        comms: Vec<kiln_comm::Communicator>,
        native: bool,
        train: F,
    ) -> Result<Vec<R>, DdpError>
    where
        R: Send,
        F: Fn(Replica) -> Result<R, TrainError> + Sync,
    {
        self.config.validate()?;
        let threads = resolve_threads(self.config.threads_per_replica, self.devices.len());
        let warm = kiln_core::warm_pool::pools_may_poll(threads, self.devices.len());
        let results: Vec<Result<R, DdpError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .into_iter()
                .zip(&self.devices)
                .enumerate()
                .map(|(local_rank, (comm, device))| {
                    let (rank, world_size) = (comm.rank(), comm.world_size());
                    // `native` refuses devices Burn has no collective for.
                    let device_group = native
                        .then(|| DeviceGroup::native(self.devices.clone(), local_rank).ok())
                        .flatten();
                    let comm = Arc::new(CommWorker::spawn(comm));
                    let abort = comm.abort_handle();
                    let replica = Replica {
                        rank,
                        world_size,
                        device: device.clone(),
                        comm,
                        config: self.config.clone(),
                        device_group,
                    };
                    let train = &train;
                    let handle = std::thread::Builder::new()
                        .name(format!("kiln-replica-{rank}"))
                        .spawn_scoped(scope, move || {
                            let pool = replica_pool(rank, threads)?;
                            kiln_core::install_warm(&pool, warm, || train(replica))
                                .map_err(|source| DdpError::Replica { rank, source })
                        })
                        .expect("failed to spawn a replica thread");
                    (rank, handle, abort)
                })
                .collect();
            handles
                .into_iter()
                .map(|(rank, handle, abort)| {
                    let result = match handle.join() {
                        Ok(result) => result,
                        Err(panic) => Err(DdpError::Panicked {
                            rank,
                            message: panic_message(panic.as_ref()),
                        }),
                    };
                    if let Err(err) = &result {
                        abort.abort(format!("replica {rank} failed: {err}"));
                    }
                    result
                })
                .collect()
        });
        let mut values = Vec::with_capacity(results.len());
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(value) => values.push(value),
                Err(err) => errors.push(err),
            }
        }
        match errors.iter().position(|e| !is_consequence(e)) {
            Some(root) => Err(errors.swap_remove(root)),
            None if !errors.is_empty() => Err(errors.swap_remove(0)),
            None => Ok(values),
        }
    }
}

/// Whether `err` only reports that another replica was lost.
fn is_consequence(err: &DdpError) -> bool {
    matches!(
        err,
        DdpError::Replica {
            source: TrainError::Comm(CommError::PeerLost { .. }),
            ..
        }
    )
}

impl Replica {
    /// This replica's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of replicas.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Whether this is rank 0 (the one that logs).
    pub fn is_primary(&self) -> bool {
        self.rank == 0
    }

    /// The replica's device (without autodiff).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The replica's training device (with autodiff; with Burn's gradient checkpointing when
    /// [`DdpConfig::gradient_checkpointing`](crate::DdpConfig::gradient_checkpointing) says
    /// so): build the model and the loader's batches on it.
    pub fn train_device(&self) -> Device {
        let device = self.device.clone().autodiff();
        if self.config.gradient_checkpointing {
            device.gradient_checkpointing()
        } else {
            device
        }
    }

    /// Splits `global_batch` over the replicas in proportion to each one's measured
    /// throughput (pass this replica's samples/s, e.g. from a few probe steps): fast devices
    /// get larger batches, so no replica waits for a slow one. Use the result's batch for
    /// this rank and [`BatchSplit::weights`](crate::BatchSplit::weights) as the loader's
    /// `shard_weights`.
    pub fn split_batch(
        &self,
        my_throughput: f64,
        global_batch: usize,
    ) -> Result<crate::BatchSplit, TrainError> {
        Ok(crate::balance::split_batch(
            &self.comm,
            my_throughput,
            global_batch,
        )?)
    }

    /// A shared handle on the replica's communication thread, for custom collectives and
    /// for custom collectives in a user's own step.
    pub fn comm(&self) -> Arc<CommWorker> {
        Arc::clone(&self.comm)
    }

    /// Replaces the module's parameters and buffers with rank 0's, so that every replica
    /// starts identical.
    pub fn broadcast_module<M: Module>(&self, module: M) -> Result<M, TrainError> {
        Ok(broadcast(&self.comm, module, Selection::All)?)
    }

    /// Fails with [`TrainError::Diverged`] unless every replica holds bit-identical
    /// parameters and buffers.
    pub fn check_divergence<M: Module>(&self, module: &M) -> Result<(), TrainError> {
        check_divergence(&self.comm, module, Selection::All)
    }

    /// The paths of the trainable parameters whose optimizer state this replica keeps:
    /// under ZeRO-1 ([`DdpConfig::zero1`](crate::DdpConfig::zero1)) those it owns, `None`
    /// without it (all of them). Resume a ZeRO-1 replica with
    /// `kiln_checkpoint::resume_owning` and these paths, and checkpoint it with
    /// `Checkpointer::optimizer_shard(rank, world_size)`.
    pub fn optimizer_shard<M: Module>(&self, model: &M) -> Option<Vec<String>> {
        self.config.zero1.then(|| {
            let params = kiln_core::param_infos(model)
                .into_iter()
                .filter(|p| p.trainable)
                .collect();
            crate::zero::ZeroPlan::new(params, self.rank, self.world_size).owned_paths()
        })
    }

    /// A step running `pass` for `objective` with this replica's communicator, options and
    /// gradient store.
    fn step<M: Module, O: Objective>(
        &self,
        pass: Box<dyn Pass<M, O>>,
        objective: O,
    ) -> DdpStep<M, O> {
        let store = GradStore::choose(
            self.config.gradient_path,
            &self.device,
            self.device_group.clone(),
            &self.comm,
        );
        DdpStep::new(
            Arc::clone(&self.comm),
            self.config.clone(),
            (pass, objective),
            store,
        )
    }

    /// A step that all-reduces gradients after backward (any image classifier).
    pub fn non_overlapped_step<M: ImageClassifier>(&self) -> DdpStep<M> {
        self.non_overlapped_step_with(Classification)
    }

    /// A step that runs backward segment by segment and all-reduces each bucket while
    /// earlier segments are still differentiating (an image classifier with segments).
    pub fn overlapped_step<M>(&self) -> DdpStep<M>
    where
        M: ImageClassifier
            + Segmented<Input = burn::tensor::Tensor<4>, Output = burn::tensor::Tensor<2>>,
        M::Hidden: std::ops::Add<Output = M::Hidden>,
    {
        self.overlapped_step_with(Classification)
    }

    /// [`non_overlapped_step`](Self::non_overlapped_step) for any model and `objective`
    /// (its loss, the batches it reads).
    pub fn non_overlapped_step_with<M, O>(&self, objective: O) -> DdpStep<M, O>
    where
        O: Objective,
        M: Forward<Input = O::Input, Output = O::Output>,
    {
        self.step(Box::new(WholeModel), objective)
    }

    /// [`overlapped_step`](Self::overlapped_step) for any [`Segmented`] model and
    /// `objective`: the segments' input and output are the objective's.
    pub fn overlapped_step_with<M, O>(&self, objective: O) -> DdpStep<M, O>
    where
        O: Objective,
        M: Segmented<Input = O::Input, Output = O::Output>,
        M::Hidden: std::ops::Add<Output = M::Hidden>,
    {
        self.step(Box::new(BySegment), objective)
    }
}
