//! The data-parallel gradient step.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

use burn::tensor::{Device, FloatDType, Tensor};
use half::{bf16, f16};
use kiln_comm::{
    CommElement, CommError, CommWorker, Communicator, Pending, PendingTensor, ReduceBuffer,
    ReduceOp,
};
use kiln_core::{FlatLayout, ImageClassifier, StatsReducer, grads_from_flat};
use kiln_data::ImageBatch;
use kiln_train::{GradientStep, StepMetrics, StepOutput, TrainError};

use crate::consensus::{Selection, average, check_divergence};
use crate::grads::{GradStore, Transport, grads_from_buckets};
use crate::pass::{OnGroup, Passes};
use crate::plan::BucketPlan;
use crate::stats::SyncStats;
use crate::zero::ZeroPlan;
use crate::{Compression, DdpConfig, SyncMode};

/// A gradient step that all-reduces bucketed gradients with the other replicas.
///
/// Gradients of each micro-batch are summed weighted by its sample count; the all-reduce
/// sums them with every replica's sample count (carried as one extra element per host
/// bucket, or reduced on its own for device buckets), and the result is divided by the total. The
/// update is therefore exactly the mean over all samples of all replicas, whatever each
/// replica's batch size.
///
/// Create it with [`Replica::non_overlapped_step`](crate::Replica::non_overlapped_step) or
/// [`Replica::overlapped_step`](crate::Replica::overlapped_step).
pub struct DdpStep<M> {
    comm: Arc<CommWorker>,
    config: DdpConfig,
    passes: Passes<M>,
    plan: Option<BucketPlan>,
    zero: Option<ZeroPlan>,
    transport: Transport,
    store: GradStore,
    stats: Arc<Mutex<SyncStats>>,
}

/// A bucket in flight and its range in the layout.
enum InFlight {
    /// Through the communicator: the reduced values followed by the total sample count.
    Host(Range<usize>, Pending<Vec<f32>>),
    /// Through a [`DeviceGroup`] (native or staged).
    Device(Range<usize>, PendingTensor<1>),
}

/// A bucket laid out for the communicator, in the element type that travels.
enum Prepared {
    Full(ReduceBuffer),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Prepared {
    /// Lays out `values` (`len` of them) for the collective, in one copy.
    fn new(
        values: impl Iterator<Item = f32>,
        len: usize,
        compression: Compression,
        world: usize,
    ) -> Self {
        match compression {
            Compression::None => {
                let mut buffer = ReduceBuffer::new(len, world);
                buffer.fill_from(values);
                Prepared::Full(buffer)
            }
            Compression::F16 => Prepared::F16(values.map(f16::from_f32).collect()),
            Compression::Bf16 => Prepared::Bf16(values.map(bf16::from_f32).collect()),
        }
    }

    /// Sums over every rank; the result widened to `f32`.
    fn reduce(self, comm: &Communicator) -> Result<Vec<f32>, CommError> {
        match self {
            Prepared::Full(mut buffer) => comm
                .all_reduce_buffer(&mut buffer, ReduceOp::Sum)
                .map(|_| buffer.to_vec()),
            Prepared::F16(narrow) => reduce_narrowed(comm, narrow),
            Prepared::Bf16(narrow) => reduce_narrowed(comm, narrow),
        }
    }
}

impl<M: ImageClassifier> DdpStep<M> {
    pub(crate) fn new(
        comm: Arc<CommWorker>,
        config: DdpConfig,
        passes: Passes<M>,
        device: Device,
        transport: Transport,
    ) -> Self {
        // ZeRO-1 reduce-scatters one host buffer.
        let transport = if config.zero1 {
            Transport::Host
        } else {
            transport
        };
        let store = match transport {
            Transport::Host => GradStore::Host(Vec::new()),
            Transport::Device(_) => GradStore::Device {
                device,
                slots: Vec::new(),
            },
        };
        Self {
            comm,
            config,
            passes,
            plan: None,
            zero: None,
            transport,
            store,
            stats: Arc::default(),
        }
    }

    /// A handle on the step's synchronisation statistics, readable after training.
    pub fn stats(&self) -> Arc<Mutex<SyncStats>> {
        Arc::clone(&self.stats)
    }

    /// How gradients travel: host buffer, staged device buckets or native device all-reduce.
    pub fn transport(&self) -> &'static str {
        self.transport.name()
    }

    /// Forward and backward of one micro-batch (gradients scaled by its size into `store`),
    /// with batch-norm statistics summed over replicas if so configured.
    fn run_pass(
        &self,
        model: &M,
        batch: ImageBatch,
        layout: &FlatLayout,
        store: &mut GradStore,
        on_group: OnGroup<'_>,
    ) -> Result<(f32, usize), TrainError> {
        let size = batch.indices.len() as f32;
        // The reducer cannot fail the forward it runs in: it records the first error, the
        // layers fall back to local statistics, and the step fails here instead.
        let failure: Rc<RefCell<Option<CommError>>> = Rc::default();
        let reduce = self.config.sync_batch_norm.then(|| {
            let (comm, failed) = (Arc::clone(&self.comm), Rc::clone(&failure));
            Box::new(move |values: Vec<f32>| {
                if failed.borrow().is_some() {
                    return None;
                }
                let summed = comm.run(move |c| {
                    let mut values = values;
                    c.all_reduce(&mut values, ReduceOp::Sum).map(|_| values)
                });
                summed.map_err(|err| *failed.borrow_mut() = Some(err)).ok()
            }) as StatsReducer
        });
        let result = (self.passes.pass)(model, batch, layout, store, size, on_group, reduce);
        match failure.take() {
            Some(err) => Err(err.into()),
            None => Ok(result),
        }
    }

    /// Starts the all-reduce of the bucket `range` of `store` (on the host buffer, with this
    /// replica's sample count appended).
    fn submit(
        &self,
        store: &GradStore,
        layout: &FlatLayout,
        range: Range<usize>,
        samples: usize,
    ) -> InFlight {
        let compression = self.config.compression;
        match (&self.transport, store) {
            (Transport::Device(group), _) => {
                let bucket = store.bucket(layout, range.clone());
                let bucket = match compression {
                    Compression::None => bucket,
                    Compression::F16 => bucket.cast(FloatDType::F16),
                    Compression::Bf16 => bucket.cast(FloatDType::BF16),
                };
                let pending = group
                    .all_reduce(bucket, ReduceOp::Sum)
                    .expect("every device collective sums");
                InFlight::Device(range, pending)
            }
            (Transport::Host, GradStore::Host(flat)) => {
                let count = std::iter::once(samples as f32);
                let values = flat[range.clone()].iter().copied().chain(count);
                let world = self.comm.world_size();
                let prepared = Prepared::new(values, range.len() + 1, compression, world);
                InFlight::Host(range, self.comm.submit(move |c| prepared.reduce(c)))
            }
            (Transport::Host, GradStore::Device { .. }) => {
                unreachable!("a host transport keeps a host store")
            }
        }
    }

    /// Waits for every bucket. Host stores receive their reduced values in place; device
    /// stores get them back as tensors.
    fn finish(
        &self,
        in_flight: Vec<InFlight>,
        store: &mut GradStore,
        samples: usize,
    ) -> Result<Finished, TrainError> {
        let mut total = samples as f32;
        let mut communication = Duration::ZERO;
        if in_flight.iter().any(|f| matches!(f, InFlight::Device(..))) {
            // Device buckets carry no count. And NCCL waits for its peers without a timeout:
            // every rank reduces its sample count here only after enqueuing all its buckets,
            // so once this (timed) collective succeeds every bucket has all its ranks, and a
            // lost peer is an error instead of a hang.
            let count = self
                .comm
                .submit(move |c| {
                    let mut count = vec![samples as f32];
                    c.all_reduce(&mut count, ReduceOp::Sum).map(|_| count)
                })
                .wait()?;
            total = count.value[0];
            communication += count.busy;
        }
        let mut reduced = Vec::with_capacity(in_flight.len());
        for flight in in_flight {
            match flight {
                InFlight::Host(range, pending) => {
                    let done = pending.wait()?;
                    communication += done.busy;
                    let (values, count) = done.value.split_at(range.len());
                    total = count[0];
                    if let GradStore::Host(flat) = store {
                        flat[range].copy_from_slice(values);
                    }
                }
                InFlight::Device(range, pending) => {
                    let done = pending.wait()?;
                    communication += done.busy;
                    let bucket = done.value;
                    let bucket = match self.config.compression {
                        Compression::None => bucket,
                        Compression::F16 | Compression::Bf16 => bucket.cast(FloatDType::F32),
                    };
                    reduced.push((range, bucket));
                }
            }
        }
        Ok(Finished {
            reduced,
            total,
            communication,
        })
    }
}

/// What the buckets of a step came back as.
struct Finished {
    /// Reduced device buckets (empty for a host store).
    reduced: Vec<(Range<usize>, Tensor<1>)>,
    /// Samples over every replica.
    total: f32,
    /// Time the communication thread spent reducing.
    communication: Duration,
}

/// All-reduces `narrow` in its half type (what travels), returning it widened to `f32`.
fn reduce_narrowed<T: CommElement>(
    comm: &Communicator,
    mut narrow: Vec<T>,
) -> Result<Vec<f32>, CommError> {
    comm.all_reduce(&mut narrow, ReduceOp::Sum)?;
    Ok(narrow.into_iter().map(T::to_f32).collect())
}

impl<M: ImageClassifier> DdpStep<M> {
    /// ZeRO-1: reduce-scatter the padded gradient regions; return only this replica's
    /// parameters' gradients, so its optimizer keeps state for them alone.
    fn zero_gradients(
        &mut self,
        model: &M,
        batches: Vec<ImageBatch>,
    ) -> Result<StepOutput, TrainError> {
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        let zero = self.zero.take().unwrap_or_else(|| {
            let params = kiln_core::param_infos(model)
                .into_iter()
                .filter(|p| p.trainable)
                .collect();
            ZeroPlan::new(params, rank, world)
        });
        let mut store = GradStore::Host(vec![0.0f32; world * zero.region]);
        let mut metrics = StepMetrics::default();
        let compute_start = Instant::now();
        for batch in batches {
            let size = batch.indices.len();
            let (loss, right) =
                self.run_pass(model, batch, &zero.full, &mut store, &mut |_, _| {})?;
            metrics.record(loss, right, size);
        }
        let samples = metrics.samples();
        let compute = compute_start.elapsed();
        let GradStore::Host(mut flat) = store else {
            unreachable!("ZeRO-1 reduces a host buffer")
        };
        for r in 0..world {
            flat[zero.count_slot(r)] = samples as f32;
        }
        let region = zero.region;
        let reduced = self
            .comm
            .submit(move |c| {
                let mut mine = vec![0.0f32; region];
                c.reduce_scatter(&flat, &mut mine, ReduceOp::Sum)
                    .map(|_| mine)
            })
            .wait()?;
        let mut mine = reduced.value;
        let scale = 1.0 / mine[region - 1].max(1.0);
        mine.iter_mut().for_each(|g| *g *= scale);
        let grads = grads_from_flat(model, &zero.owned, &mine);
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.steps += 1;
            stats.compute += compute;
            stats.communication += reduced.busy;
            stats.exposed += reduced.busy;
            stats.buckets += 1;
            stats.bytes += 4 * world * region;
            stats.optimizer_shard = Some((zero.owned_numel, zero.total_numel));
        }
        self.zero = Some(zero);
        Ok(metrics.output(grads))
    }

    /// ZeRO-1: every replica contributes the parameters it updated; all receive all.
    fn zero_gather(&mut self, model: M) -> Result<M, TrainError> {
        let zero = self.zero.as_ref().expect("gradients ran first");
        let mine = kiln_core::read_params(&model, &zero.owned);
        let world = self.comm.world_size();
        let gathered = self.comm.run(move |c| {
            let mut all = vec![0.0f32; world * mine.len()];
            c.all_gather(&mine, &mut all).map(|_| all)
        })?;
        Ok(kiln_core::write_params(model, &zero.full, &gathered))
    }
}

impl<M: ImageClassifier> GradientStep<M> for DdpStep<M> {
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<ImageBatch>,
        _step: usize,
    ) -> Result<StepOutput, TrainError> {
        if self.config.zero1 && self.config.mode == SyncMode::Gradients {
            return self.zero_gradients(model, batches);
        }
        let plan = match self.plan.take() {
            Some(plan) => plan,
            None => BucketPlan::new(
                (self.passes.groups)(model),
                self.config.first_bucket_bytes,
                self.config.bucket_cap_bytes,
            ),
        };
        let layout = plan.layout();
        let mut store = std::mem::replace(&mut self.store, GradStore::Host(Vec::new()));
        store.reset(layout);

        let samples: usize = batches.iter().map(|b| b.indices.len()).sum();
        let synchronous = self.config.mode == SyncMode::Gradients;
        let count = batches.len();
        let mut metrics = StepMetrics::default();
        let mut in_flight: Vec<InFlight> = Vec::with_capacity(plan.buckets().len());
        let compute_start = Instant::now();
        for (index, batch) in batches.into_iter().enumerate() {
            let last = index + 1 == count;
            let size = batch.indices.len();
            let mut on_group = |group: usize, store: &GradStore| {
                if last && synchronous {
                    for bucket in
                        plan.buckets()[in_flight.len()..plan.ready_after_group(group)].iter()
                    {
                        in_flight.push(self.submit(store, layout, bucket.clone(), samples));
                    }
                }
            };
            let (loss, right) = self.run_pass(model, batch, layout, &mut store, &mut on_group)?;
            metrics.record(loss, right, size);
        }
        let compute = compute_start.elapsed();

        let wait_start = Instant::now();
        let buckets = in_flight.len();
        let Finished {
            mut reduced,
            total,
            communication,
        } = self.finish(in_flight, &mut store, samples)?;
        let exposed = wait_start.elapsed();
        let scale = 1.0 / total.max(1.0);
        let grads = match &mut store {
            GradStore::Host(flat) => {
                flat.iter_mut().for_each(|g| *g *= scale);
                grads_from_flat(model, layout, flat)
            }
            GradStore::Device { .. } => {
                if !synchronous {
                    reduced = plan
                        .buckets()
                        .iter()
                        .map(|range| (range.clone(), store.bucket(layout, range.clone())))
                        .collect();
                }
                grads_from_buckets(model, layout, reduced, scale)
            }
        };
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.steps += 1;
            stats.compute += compute;
            stats.communication += communication;
            stats.exposed += exposed;
            stats.buckets += buckets;
            if synchronous {
                let element = match self.config.compression {
                    Compression::None => 4,
                    Compression::F16 | Compression::Bf16 => 2,
                };
                stats.bytes += element * (layout.len() + buckets);
            }
        }
        if let GradStore::Device { slots, .. } = &mut store {
            slots.clear(); // frees the device memory of this step's gradients
        }
        self.store = store;
        self.plan = Some(plan);
        Ok(metrics.output(grads))
    }

    fn after_update(&mut self, model: M, step: usize) -> Result<M, TrainError> {
        let model = if self.zero.is_some() {
            self.zero_gather(model)?
        } else {
            model
        };
        let model = match self.config.mode {
            SyncMode::LocalSgd { period } if (step + 1).is_multiple_of(period) => {
                average(&self.comm, model, Selection::All)?
            }
            _ => model,
        };
        let every = self.config.divergence_check_every;
        if every > 0 && (step + 1).is_multiple_of(every) && self.config.mode == SyncMode::Gradients
        {
            // Running statistics legitimately differ between evaluations; parameters must not.
            check_divergence(&self.comm, &model, Selection::Trainable)?;
        }
        Ok(model)
    }

    fn before_eval(&mut self, model: M) -> Result<M, TrainError> {
        // Batch-norm running statistics differ per replica (each saw its own shard): use their
        // mean, so that every replica evaluates and checkpoints the same model.
        let selection = match self.config.mode {
            SyncMode::Gradients => Selection::Buffers,
            SyncMode::LocalSgd { .. } => Selection::All,
            SyncMode::Unsynchronized => return Ok(model),
        };
        Ok(average(&self.comm, model, selection)?)
    }
}
