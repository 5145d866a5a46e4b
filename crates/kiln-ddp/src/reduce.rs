//! Reducing a replica's gradient buckets over every replica: started bucket by bucket as
//! backward completes them ([`crate::bucketing`]), waited for at the end of the step.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use burn::tensor::{FloatDType, Tensor};
use half::{bf16, f16};
use kiln_comm::{
    CommElement, CommError, CommWorker, Communicator, Pending, PendingTensor, ReduceBuffer,
    ReduceOp,
};
use kiln_core::FlatLayout;
use kiln_train::TrainError;

use crate::Compression;
use crate::grads::{DeviceBuckets, GradStore, device_bucket};

/// A bucket in flight and its range in the layout.
pub(crate) enum InFlight {
    /// Through the communicator: the reduced values followed by the total sample count.
    Host(Range<usize>, Pending<Vec<f32>>),
    /// Through a device group (native or staged).
    Device(Range<usize>, PendingTensor<1>),
}

/// What the buckets of a step came back as.
pub(crate) struct Finished {
    /// Reduced device buckets (empty for a host store, which received its values in place).
    pub reduced: DeviceBuckets,
    /// Samples over every replica.
    pub total: f32,
    /// Time the communication thread spent reducing.
    pub communication: Duration,
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

/// All-reduces `narrow` in its half type (what travels), returning it widened to `f32`.
fn reduce_narrowed<T: CommElement>(
    comm: &Communicator,
    mut narrow: Vec<T>,
) -> Result<Vec<f32>, CommError> {
    comm.all_reduce(&mut narrow, ReduceOp::Sum)?;
    Ok(narrow.into_iter().map(T::to_f32).collect())
}

/// How a step's buckets travel: the compression and the communication thread.
#[derive(Clone, Copy)]
pub(crate) struct Wire<'a> {
    /// Element type on the wire.
    pub compression: Compression,
    /// The replica's communication thread.
    pub comm: &'a Arc<CommWorker>,
}

impl GradStore {
    /// Starts the all-reduce of the bucket `range` (host buffers carry this replica's
    /// `samples` as one extra element).
    pub(crate) fn start_reduce(
        &self,
        layout: &FlatLayout,
        range: Range<usize>,
        samples: usize,
        wire: Wire<'_>,
    ) -> InFlight {
        match self {
            GradStore::Device {
                device,
                slots,
                group,
            } => {
                let bucket = device_bucket(device, slots, layout, range.clone());
                let bucket = match wire.compression {
                    Compression::None => bucket,
                    Compression::F16 => bucket.cast(FloatDType::F16),
                    Compression::Bf16 => bucket.cast(FloatDType::BF16),
                };
                let pending = group
                    .all_reduce(bucket, ReduceOp::Sum)
                    .expect("every device collective sums");
                InFlight::Device(range, pending)
            }
            GradStore::Host(flat) => {
                let count = std::iter::once(samples as f32);
                let values = flat[range.clone()].iter().copied().chain(count);
                let world = wire.comm.world_size();
                let prepared = Prepared::new(values, range.len() + 1, wire.compression, world);
                InFlight::Host(range, wire.comm.submit(move |c| prepared.reduce(c)))
            }
        }
    }

    /// Waits for every bucket. A host store receives its reduced values in place; a device
    /// store gets them back as tensors.
    pub(crate) fn finish_reduce(
        &mut self,
        in_flight: Vec<InFlight>,
        samples: usize,
        wire: Wire<'_>,
    ) -> Result<Finished, TrainError> {
        let mut total = samples as f32;
        let mut communication = Duration::ZERO;
        if in_flight.iter().any(|f| matches!(f, InFlight::Device(..))) {
            // Device buckets carry no count. And NCCL waits for its peers without a timeout:
            // every rank reduces its sample count here only after enqueuing all its buckets,
            // so once this (timed) collective succeeds every bucket has all its ranks, and a
            // lost peer is an error instead of a hang.
            let count = wire
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
                    if let GradStore::Host(flat) = self {
                        flat[range].copy_from_slice(values);
                    }
                }
                InFlight::Device(range, pending) => {
                    let done = pending.wait()?;
                    communication += done.busy;
                    let bucket = match wire.compression {
                        Compression::None => done.value,
                        Compression::F16 | Compression::Bf16 => done.value.cast(FloatDType::F32),
                    };
                    reduced.push((range, bucket));
                }
            }
        }
        Ok(Finished {
            reduced: DeviceBuckets(reduced),
            total,
            communication,
        })
    }

    /// A lone replica's gradients as device buckets of one layout entry each: nothing to
    /// concatenate, reduce or split again. Empty for a host store.
    pub(crate) fn entry_buckets(&mut self, layout: &FlatLayout) -> DeviceBuckets {
        match self {
            GradStore::Device { device, slots, .. } => DeviceBuckets(
                layout
                    .entries()
                    .iter()
                    .zip(slots.iter_mut())
                    .map(|(entry, slot)| {
                        let numel = entry.info.numel();
                        let grad = slot
                            .take()
                            .unwrap_or_else(|| Tensor::zeros([numel], &*device));
                        (entry.offset..entry.offset + numel, grad)
                    })
                    .collect(),
            ),
            GradStore::Host(_) => DeviceBuckets(Vec::new()),
        }
    }

    /// This replica's own gradients as device buckets `ranges` (steps that do not reduce).
    /// Empty for a host store.
    pub(crate) fn local_buckets(
        &self,
        layout: &FlatLayout,
        ranges: &[Range<usize>],
    ) -> DeviceBuckets {
        match self {
            GradStore::Device { device, slots, .. } => DeviceBuckets(
                ranges
                    .iter()
                    .map(|range| {
                        let bucket = device_bucket(device, slots, layout, range.clone());
                        (range.clone(), bucket)
                    })
                    .collect(),
            ),
            GradStore::Host(_) => DeviceBuckets(Vec::new()),
        }
    }
}
