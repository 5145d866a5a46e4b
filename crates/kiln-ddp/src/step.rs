//! The data-parallel gradient step.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use kiln_comm::{CommElement, CommWorker, Pending, ReduceBuffer, ReduceOp};
use kiln_core::{ImageClassifier, grads_from_flat};
use kiln_data::ImageBatch;
use kiln_train::{GradientStep, StepOutput, TrainError};

use crate::pass::{Groups, Pass};
use crate::plan::BucketPlan;
use crate::sync::{Selection, average, check_divergence};
use crate::zero::ZeroPlan;
use crate::{Compression, DdpConfig, SyncMode};

/// How much of the gradient communication the step hid behind backward.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncStats {
    /// Optimizer steps measured.
    pub steps: usize,
    /// Time spent computing forward and backward.
    pub compute: Duration,
    /// Time the communication thread spent all-reducing gradients.
    pub communication: Duration,
    /// Time the step waited for communication after its backward had finished.
    pub exposed: Duration,
    /// Buckets all-reduced.
    pub buckets: usize,
    /// Bytes sent into all-reduce (per replica).
    pub bytes: usize,
    /// With ZeRO-1: (parameters whose optimizer state this replica keeps, all parameters).
    pub optimizer_shard: Option<(usize, usize)>,
}

impl SyncStats {
    /// Fraction of communication time that overlapped computation (1 = fully hidden).
    pub fn hidden_fraction(&self) -> f64 {
        if self.communication.is_zero() {
            return 1.0;
        }
        (1.0 - self.exposed.as_secs_f64() / self.communication.as_secs_f64()).clamp(0.0, 1.0)
    }

    /// Exposed synchronisation as a fraction of compute time.
    pub fn overhead(&self) -> f64 {
        self.exposed.as_secs_f64() / self.compute.as_secs_f64().max(1e-12)
    }
}

/// A gradient step that all-reduces bucketed gradients with the other replicas.
///
/// Gradients of each micro-batch are summed weighted by its sample count; the all-reduce
/// sums them with every replica's sample count (carried as one extra element per bucket),
/// and the result is divided by the total. The update is therefore exactly the mean over
/// all samples of all replicas, whatever each replica's batch size.
///
/// Create it with [`Replica::gradient_step`](crate::Replica::gradient_step) or
/// [`Replica::overlapped_step`](crate::Replica::overlapped_step).
pub struct DdpStep<M> {
    comm: Arc<CommWorker>,
    config: DdpConfig,
    pass: Pass<M>,
    groups: Groups<M>,
    plan: Option<BucketPlan>,
    zero: Option<ZeroPlan>,
    flat: Vec<f32>,
    stats: Arc<Mutex<SyncStats>>,
}

/// A bucket in flight: (its range in the flat buffer, the pending all-reduce).
type InFlight = (std::ops::Range<usize>, Pending<Vec<f32>>);

impl<M: ImageClassifier> DdpStep<M> {
    pub(crate) fn new(
        comm: Arc<CommWorker>,
        config: DdpConfig,
        pass: Pass<M>,
        groups: Groups<M>,
    ) -> Self {
        Self {
            comm,
            config,
            pass,
            groups,
            plan: None,
            zero: None,
            flat: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// A handle on the step's synchronisation statistics, readable after training.
    pub fn stats(&self) -> Arc<Mutex<SyncStats>> {
        Arc::clone(&self.stats)
    }

    /// Starts the all-reduce of `flat[range]` plus this replica's sample count.
    fn submit(&self, flat: &[f32], range: std::ops::Range<usize>, samples: usize) -> InFlight {
        // The bucket is laid out for the collective right here, in one copy out of `flat`.
        let values = flat[range.clone()]
            .iter()
            .copied()
            .chain(std::iter::once(samples as f32));
        let pending = match self.config.compression {
            Compression::None => {
                let mut buffer = ReduceBuffer::new(range.len() + 1, self.comm.world_size());
                buffer.fill_from(values);
                self.comm.submit(move |c| {
                    c.all_reduce_buffer(&mut buffer, ReduceOp::Sum)
                        .map(|_| buffer.to_vec())
                })
            }
            Compression::F16 => {
                let narrow: Vec<f16> = values.map(f16::from_f32).collect();
                self.comm.submit(move |c| reduce_narrowed(c, narrow))
            }
            Compression::Bf16 => {
                let narrow: Vec<bf16> = values.map(bf16::from_f32).collect();
                self.comm.submit(move |c| reduce_narrowed(c, narrow))
            }
        };
        (range, pending)
    }
}

/// All-reduces `narrow` in its half type (what travels), returning it widened to `f32`.
fn reduce_narrowed<T: CommElement>(
    comm: &kiln_comm::Communicator,
    mut narrow: Vec<T>,
) -> Result<Vec<f32>, kiln_comm::CommError> {
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
        let mut flat = vec![0.0f32; world * zero.region];
        let samples: usize = batches.iter().map(|b| b.indices.len()).sum();
        let (mut loss_sum, mut correct) = (0.0f64, 0usize);
        let compute_start = Instant::now();
        for batch in batches {
            let size = batch.indices.len();
            let (loss, right) = (self.pass)(
                model,
                batch,
                &zero.full,
                &mut flat,
                size as f32,
                &mut |_, _| {},
            );
            loss_sum += f64::from(loss) * size as f64;
            correct += right;
        }
        let compute = compute_start.elapsed();
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
        Ok(StepOutput {
            grads,
            loss: (loss_sum / samples.max(1) as f64) as f32,
            correct,
            samples,
        })
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
                (self.groups)(model),
                self.config.first_bucket_bytes,
                self.config.bucket_cap_bytes,
            ),
        };
        let mut flat = std::mem::take(&mut self.flat);
        flat.clear();
        flat.resize(plan.layout().len(), 0.0);

        let samples: usize = batches.iter().map(|b| b.indices.len()).sum();
        let synchronous = self.config.mode == SyncMode::Gradients;
        let count = batches.len();
        let (mut loss_sum, mut correct) = (0.0f64, 0usize);
        let mut in_flight: Vec<InFlight> = Vec::with_capacity(plan.buckets().len());
        let compute_start = Instant::now();
        for (index, batch) in batches.into_iter().enumerate() {
            let last = index + 1 == count;
            let size = batch.indices.len();
            let mut on_group = |group: usize, flat: &[f32]| {
                if last && synchronous {
                    for bucket in
                        plan.buckets()[in_flight.len()..plan.ready_after_group(group)].iter()
                    {
                        in_flight.push(self.submit(flat, bucket.clone(), samples));
                    }
                }
            };
            let (loss, right) = (self.pass)(
                model,
                batch,
                plan.layout(),
                &mut flat,
                size as f32,
                &mut on_group,
            );
            loss_sum += f64::from(loss) * size as f64;
            correct += right;
        }
        let compute = compute_start.elapsed();

        let wait_start = Instant::now();
        let mut total = samples as f32;
        let mut communication = Duration::ZERO;
        let buckets = in_flight.len();
        for (range, pending) in in_flight {
            let reduced = pending.wait()?;
            communication += reduced.busy;
            let (values, count) = reduced.value.split_at(range.len());
            flat[range].copy_from_slice(values);
            total = count[0];
        }
        let exposed = wait_start.elapsed();
        let scale = 1.0 / total.max(1.0);
        flat.iter_mut().for_each(|g| *g *= scale);
        let grads = grads_from_flat(model, plan.layout(), &flat);
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.steps += 1;
            stats.compute += compute;
            stats.communication += communication;
            stats.exposed += exposed;
            stats.buckets += buckets;
            stats.bytes += if synchronous {
                4 * (flat.len() + buckets)
            } else {
                0
            };
        }
        self.flat = flat;
        self.plan = Some(plan);
        Ok(StepOutput {
            grads,
            loss: (loss_sum / samples.max(1) as f64) as f32,
            correct,
            samples,
        })
    }

    fn after_update(&mut self, model: M, step: usize) -> Result<M, TrainError> {
        let model = if self.zero.is_some() {
            self.zero_gather(model)?
        } else {
            model
        };
        let model = match self.config.mode {
            SyncMode::LocalSgd { period } if (step + 1).is_multiple_of(period.max(1)) => {
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
