//! The data-parallel gradient step.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::optim::GradientsParams;
use kiln_amp::AmpStats;
use kiln_comm::{CommError, CommWorker, ReduceOp};
use kiln_core::{FlatLayout, StatsReducer, grads_from_flat};
use kiln_data::Batch;
use kiln_train::{
    Classification, GradientStep, GradientSummary, MeanGradient, Objective, StepMetrics,
    StepOutput, TrainError,
};

use crate::bucketing::{Bucketing, NoBuckets};
use crate::consensus::{Selection, average, check_divergence};
use crate::grads::{GradStore, grads_from_buckets};
use crate::pass::{GroupSink, Pass, PassContext};
use crate::plan::BucketPlan;
use crate::reduce::{Finished, Wire};
use crate::stats::SyncStats;
use crate::zero::ZeroPlan;
use crate::{Compression, DdpConfig, SyncMode};

/// A gradient step that all-reduces bucketed gradients with the other replicas, in the
/// configured precision ([`DdpConfig::precision`]).
///
/// Gradients of each micro-batch are summed weighted by its sample count; the all-reduce
/// sums them with every replica's sample count (carried as one extra element per host
/// bucket, or reduced on its own for device buckets), and [`MeanGradient`] divides by the
/// total. The update is therefore exactly the mean over all samples of all replicas,
/// whatever each replica's batch size. Under mixed precision the passes run on a working
/// copy cast once per step and add f32 gradients, unscaled; the reduced gradients are
/// identical on every replica, so every replica reaches the same skip decision (ZeRO-1 and
/// local SGD agree on it with one small all-reduce).
///
/// Create it with [`Replica::non_overlapped_step`](crate::Replica::non_overlapped_step) or
/// [`Replica::overlapped_step`](crate::Replica::overlapped_step) (for [`Classification`]),
/// or their `_with` forms for any [`Objective`] `O`.
pub struct DdpStep<M, O: Objective = Classification> {
    comm: Arc<CommWorker>,
    config: DdpConfig,
    pass: Box<dyn Pass<M, O>>,
    objective: O,
    plan: Option<BucketPlan>,
    zero: Option<ZeroPlan>,
    store: GradStore,
    rule: MeanGradient,
    stats: Arc<Mutex<SyncStats>>,
}

impl<M: Module, O: Objective> DdpStep<M, O> {
    /// # Panics
    /// If `config` was not validated ([`DdpConfig::validate`] checks the clipping norm).
    pub(crate) fn new(
        comm: Arc<CommWorker>,
        config: DdpConfig,
        (pass, objective): (Box<dyn Pass<M, O>>, O),
        store: GradStore,
    ) -> Self {
        // ZeRO-1 reduce-scatters one host buffer.
        let store = if config.zero1 {
            GradStore::Host(Vec::new())
        } else {
            store
        };
        let mut rule = MeanGradient::new(config.precision.clone());
        if let Some(max_norm) = config.max_grad_norm {
            rule = rule
                .with_max_norm(max_norm)
                .expect("DdpConfig::validate checks the norm");
        }
        Self {
            comm,
            config,
            pass,
            objective,
            plan: None,
            zero: None,
            store,
            rule,
            stats: Arc::default(),
        }
    }

    /// A handle on the step's synchronisation statistics, readable after training.
    pub fn stats(&self) -> Arc<Mutex<SyncStats>> {
        Arc::clone(&self.stats)
    }

    /// A handle on the mixed-precision statistics (skipped steps, loss scale).
    pub fn amp_stats(&self) -> Arc<Mutex<AmpStats>> {
        self.rule.stats()
    }

    /// The precision the step computes in.
    pub fn precision(&self) -> kiln_amp::Precision {
        self.config.precision.precision()
    }

    /// How gradients travel: host buffer, staged device buckets or native device all-reduce.
    pub fn transport(&self) -> &'static str {
        self.store.name()
    }

    /// Forward and backward of one micro-batch on `working` (gradients weighted into
    /// `store`), with batch-norm statistics summed over replicas if so configured.
    fn run_pass(
        &self,
        working: &M,
        batch: O::Batch,
        layout: &FlatLayout,
        store: &mut GradStore,
        sink: &mut dyn GroupSink,
    ) -> Result<(f32, usize), TrainError> {
        // The reducer cannot fail the forward it runs in: it records the first error, the
        // layers fall back to local statistics, and the step fails here instead.
        let failure: Rc<RefCell<Option<CommError>>> = Rc::default();
        let reduce = self.config.sync_batch_norm.then(|| {
            let (comm, failed) = (Arc::clone(&self.comm), Rc::clone(&failure));
            Box::new(move |values: Vec<f32>| {
                if failed.borrow().is_some() {
                    return None;
                }
                let summed = comm.all_reduce_values(values, ReduceOp::Sum);
                summed.map_err(|err| *failed.borrow_mut() = Some(err)).ok()
            }) as StatsReducer
        });
        let context = PassContext {
            layout,
            store,
            precision: self.rule.precision(),
            sink,
            reduce,
        };
        let result = self.pass.run(working, &self.objective, batch, context);
        match failure.take() {
            Some(err) => Err(err.into()),
            None => Ok(result),
        }
    }

    /// ZeRO-1: reduce-scatter the padded gradient regions; return only this replica's
    /// parameters' gradients, so its optimizer keeps state for them alone.
    fn zero_gradients(
        &mut self,
        model: &M,
        batches: Vec<O::Batch>,
    ) -> Result<StepOutput, TrainError> {
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        let zero = self.zero.take().unwrap_or_else(|| {
            let params = kiln_core::param_infos(model)
                .into_iter()
                .filter(|p| p.trainable)
                .collect();
            ZeroPlan::new(params, rank, world)
        });
        let working = self.rule.precision().working_copy(model);
        let working = working.as_ref().unwrap_or(model);
        let mut store = GradStore::Host(vec![0.0f32; world * zero.region]);
        let mut metrics = StepMetrics::default();
        let compute_start = Instant::now();
        for batch in batches {
            let size = batch.samples();
            let (loss, right) =
                self.run_pass(working, batch, &zero.full, &mut store, &mut NoBuckets)?;
            metrics.record(loss, right, size);
        }
        let samples = metrics.samples();
        let compute = compute_start.elapsed();
        let GradStore::Host(mut flat) = store else {
            unreachable!("made as a host buffer above")
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
        let total = mine[region - 1];
        // Each replica holds one shard: the norm and the overflow flag are summed over all.
        let comm = &self.comm;
        let apply = self
            .rule
            .finish(&mut mine[..region - 1], total, |summary| {
                sum_summaries(comm, summary)
            })?;
        let grads = if apply {
            grads_from_flat(model, &zero.owned, &mine)
        } else {
            GradientsParams::new()
        };
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

/// The summary of the union of every replica's gradients (ZeRO shards): squared norms
/// summed, overflow if any replica overflowed.
pub(crate) fn sum_summaries(
    comm: &CommWorker,
    summary: GradientSummary,
) -> Result<GradientSummary, TrainError> {
    summary.sum_over_ranks(|values, op| comm.all_reduce_values(values, op))
}

impl<M: Module, O: Objective> GradientStep<M, O::Batch> for DdpStep<M, O> {
    fn gradients(
        &mut self,
        model: &M,
        batches: Vec<O::Batch>,
        _step: usize,
    ) -> Result<StepOutput, TrainError> {
        if self.config.zero1 && self.config.mode == SyncMode::Gradients {
            return self.zero_gradients(model, batches);
        }
        let plan = match self.plan.take() {
            Some(plan) => plan,
            None => BucketPlan::new(
                self.pass.groups(model),
                self.config.first_bucket_bytes,
                self.config.bucket_cap_bytes,
            ),
        };
        let layout = plan.layout();
        let mut store = std::mem::replace(&mut self.store, GradStore::Host(Vec::new()));
        store.reset(layout);
        let working = self.rule.precision().working_copy(model);
        let working = working.as_ref().unwrap_or(model);

        let samples: usize = batches.iter().map(Batch::samples).sum();
        let synchronous = self.config.mode == SyncMode::Gradients;
        // A replica with no peers runs the plain step: no buckets, no collectives.
        let alone = self.comm.world_size() == 1;
        let wire = Wire {
            compression: self.config.compression,
            comm: &self.comm,
        };
        let count = batches.len();
        let mut metrics = StepMetrics::default();
        // Buckets start during the last micro-batch's backward (earlier ones only add up).
        let mut bucketing = Bucketing::new(&plan, wire, samples);
        let compute_start = Instant::now();
        for (index, batch) in batches.into_iter().enumerate() {
            let size = batch.samples();
            let sink: &mut dyn GroupSink = if index + 1 == count && synchronous && !alone {
                &mut bucketing
            } else {
                &mut NoBuckets
            };
            let (loss, right) = self.run_pass(working, batch, layout, &mut store, sink)?;
            metrics.record(loss, right, size);
        }
        let compute = compute_start.elapsed();

        let wait_start = Instant::now();
        let during_backward = bucketing.during_backward();
        let in_flight = bucketing.into_in_flight();
        let buckets = in_flight.len();
        let (
            Finished {
                reduced,
                total,
                communication,
            },
            exposed,
        ) = if alone {
            let own = Finished {
                reduced: store.entry_buckets(layout),
                total: samples as f32,
                communication: Duration::ZERO,
            };
            (own, Duration::ZERO)
        } else {
            let finished = store.finish_reduce(in_flight, samples, wire)?;
            (finished, wait_start.elapsed())
        };
        let device_buckets = if synchronous || alone {
            reduced
        } else {
            store.local_buckets(layout, plan.buckets())
        };
        let (comm, mode) = (&self.comm, self.config.mode);
        let agree = |summary| agree_on_summary(comm, mode, summary);
        let grads = match &mut store {
            GradStore::Host(flat) => {
                let apply = self.rule.finish(&mut flat[..], total, agree)?;
                apply.then(|| grads_from_flat(model, layout, flat))
            }
            GradStore::Device { .. } => {
                let mut buckets = device_buckets;
                let apply = self.rule.finish(&mut buckets, total, agree)?;
                apply.then(|| grads_from_buckets(model, layout, buckets))
            }
        };
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.steps += 1;
            stats.compute += compute;
            stats.communication += communication;
            stats.exposed += exposed;
            stats.buckets += buckets;
            stats.buckets_during_backward += during_backward;
            if synchronous && buckets > 0 {
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
        // No gradients for a skipped step: the optimizer leaves parameters and state alone.
        Ok(metrics.output(grads.unwrap_or_else(GradientsParams::new)))
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
            // Batch-norm running statistics (each replica's forward updated its own): their
            // mean after every step keeps the replicas identical at all times. Averaged only
            // before evaluations and checkpoints, a checkpoint mid-epoch moved their rounding
            // and the run no longer ended like one without it. (PyTorch's DDP broadcasts
            // rank 0's buffers before every forward instead.)
            SyncMode::Gradients => average(&self.comm, model, Selection::Buffers)?,
            _ => model,
        };
        let every = self.config.divergence_check_every;
        if every > 0 && (step + 1).is_multiple_of(every) && self.config.mode == SyncMode::Gradients
        {
            // The parameters: the running statistics were just averaged above.
            check_divergence(&self.comm, &model, Selection::Trainable)?;
        }
        Ok(model)
    }

    fn saved_state(&self) -> kiln_train::StepState {
        self.rule.saved_state()
    }

    fn loss_scale(&self) -> Option<f32> {
        self.rule.loss_scale()
    }

    fn restore_state(&mut self, state: &kiln_train::StepState) -> Result<(), TrainError> {
        self.rule.restore_state(state)
    }

    fn agree_to_stop(&mut self, asked: bool) -> Result<bool, TrainError> {
        // One value per step, only when the run can be stopped: any replica asked stops all.
        let votes = self
            .comm
            .all_reduce_values(vec![f32::from(u8::from(asked))], ReduceOp::Sum)?;
        Ok(votes[0] > 0.0)
    }

    fn agree_on_start(&mut self, step: usize) -> Result<(), TrainError> {
        // A lone replica exchanges nothing. Exact for any step (f32 alone would round past
        // 2^24).
        if self.comm.world_size() == 1 {
            return Ok(());
        }
        let (first, last) = self.comm.run(move |comm| comm.value_range(step as u64))?;
        if first != last {
            return Err(TrainError::checkpoint(format!(
                "replicas would start at different steps ({first} to {last}): every replica must resume the same checkpoint (under MPI, a run directory every process shares)"
            )));
        }
        Ok(())
    }

    fn before_eval(&mut self, model: M) -> Result<M, TrainError> {
        match self.config.mode {
            // Already one model: buffers are averaged after every step (`after_update`), and
            // averaging again here would change the rounding whenever a checkpoint is taken.
            SyncMode::Gradients | SyncMode::Unsynchronized => Ok(model),
            // Local-SGD replicas differ between averagings: evaluate and checkpoint the mean.
            SyncMode::LocalSgd { .. } => Ok(average(&self.comm, model, Selection::All)?),
        }
    }
}

/// The summary every replica finishes with. Synchronous replicas hold identical reduced
/// gradients, so each keeps its own. Local-SGD replicas agree on the overflow flag, so that
/// they skip the same steps and keep identical loss scales; each clips its own update by its
/// own norm. Unsynchronized replicas are independent.
pub(crate) fn agree_on_summary(
    comm: &CommWorker,
    mode: SyncMode,
    summary: GradientSummary,
) -> Result<GradientSummary, TrainError> {
    match mode {
        SyncMode::LocalSgd { .. } => {
            let flag = vec![f32::from(u8::from(summary.non_finite))];
            let any = comm.all_reduce_values(flag, ReduceOp::Sum)?;
            Ok(GradientSummary {
                non_finite: any[0] > 0.0,
                ..summary
            })
        }
        SyncMode::Gradients | SyncMode::Unsynchronized => Ok(summary),
    }
}
