//! The cost model: predicted step time and peak memory per device of a data-parallel, a
//! pipelined or a hybrid plan, from a model's profile.

use std::ops::Range;

use kiln_schedule::{Costs, Schedule, ScheduleKind, simulate};

use crate::PlanError;
use crate::model_profile::{ModelProfile, SegmentAt};
use crate::partition::{DeviceCapacity, SegmentCost, balance_stages};
use crate::plan::{Layout, Plan, Predicted, ranges};

/// One device the plan may use.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanDevice {
    /// As `--devices` names it.
    pub name: String,
    /// Its time for some work ÷ the profiled device's (2.0: twice as slow).
    pub slowdown: f64,
    /// Bytes it may hold; `None`: no limit.
    pub memory: Option<u64>,
}

/// How fast the devices exchange data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interconnect {
    /// Fixed seconds per all-reduce (per bucket).
    pub all_reduce_latency: f64,
    /// Seconds per byte of the reduced buffer, for a ring's `2(D−1)/D` bytes per byte.
    pub all_reduce_seconds_per_byte: f64,
    /// Seconds per byte sent from one pipeline stage to the next (0: shared memory).
    pub transfer_seconds_per_byte: f64,
}

impl Interconnect {
    /// Seconds to all-reduce `bytes` over `ranks` ranks (0 for one rank).
    pub fn all_reduce(&self, ranks: usize, bytes: u64) -> f64 {
        if ranks <= 1 || bytes == 0 {
            return 0.0;
        }
        let ring = 2.0 * (ranks - 1) as f64 / ranks as f64;
        self.all_reduce_latency + ring * bytes as f64 * self.all_reduce_seconds_per_byte
    }
}

/// What is trained: the same for every plan compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Samples per optimizer step over all devices.
    pub global_batch: usize,
    /// Optimizer state bytes per trainable parameter byte (SGD with momentum 1, AdamW 2,
    /// plain SGD 0).
    pub optimizer_state_factor: f64,
}

/// Bytes a segment's state takes on a device that trains it: its buffers, and per trainable
/// byte the parameter, the gradient autodiff produces, the flat gradient kiln sums into, and
/// the optimizer state.
pub(crate) fn state_bytes(segment: &SegmentAt, workload: &Workload) -> u64 {
    let per_trainable = 3.0 + workload.optimizer_state_factor;
    segment.buffer_bytes + (segment.trainable_bytes as f64 * per_trainable).round() as u64
}

/// Data parallel over every device: batch shares in proportion to speed (equal on equal
/// devices), buckets all-reduced in backward order while earlier segments still compute.
///
/// # Errors
/// [`PlanError::Request`] if the global batch is smaller than the device count.
pub fn predict_data_parallel(
    profile: &ModelProfile,
    devices: &[PlanDevice],
    net: &Interconnect,
    workload: &Workload,
) -> Result<Plan, PlanError> {
    let n = devices.len();
    if workload.global_batch < n {
        return Err(PlanError::Request(format!(
            "a global batch of {} cannot give each of {n} replicas a sample",
            workload.global_batch
        )));
    }
    let speeds: Vec<f64> = devices.iter().map(|d| 1.0 / d.slowdown).collect();
    let mut batches = kiln_data::proportional_split(workload.global_batch, &speeds);
    // A much slower device still gets a sample (the global batch allows it: checked above).
    while let Some(empty) = batches.iter().position(|&b| b == 0) {
        let largest = (0..n).max_by_key(|&i| batches[i]).expect("devices");
        batches[largest] -= 1;
        batches[empty] += 1;
    }
    let mut step: f64 = 0.0;
    let mut exposed: f64 = 0.0;
    let mut device_bytes = Vec::with_capacity(n);
    for (device, &batch) in devices.iter().zip(&batches) {
        let segments = profile.at(batch.max(1));
        let forward: f64 = segments.iter().map(|s| s.forward).sum::<f64>() * device.slowdown;
        // Each segment's gradients are ready when its backward ends (last segment first);
        // one all-reduce at a time, each starting when both it and the link are ready.
        let (mut clock, mut link) = (0.0f64, 0.0f64);
        for segment in segments.iter().rev() {
            clock += segment.backward * device.slowdown;
            link = link.max(clock) + net.all_reduce(n, segment.trainable_bytes);
        }
        let trainable: u64 = segments.iter().map(|s| s.trainable_bytes).sum();
        let update = trainable as f64 * profile.update_seconds_per_byte * device.slowdown;
        step = step.max(forward + link.max(clock) + update);
        exposed = exposed.max(link - clock).max(0.0);
        device_bytes.push(
            segments
                .iter()
                .map(|s| s.activation_bytes.map(|a| a + state_bytes(s, workload)))
                .sum::<Option<u64>>(),
        );
    }
    Ok(Plan {
        model: profile.key.model.clone(),
        devices: devices.iter().map(|d| d.name.clone()).collect(),
        global_batch: workload.global_batch,
        segment_names: profile.segment_names(),
        layout: Layout::DataParallel { batches },
        predicted: Predicted {
            step_seconds: step,
            device_bytes,
            exposed_communication_seconds: exposed,
            bubble_fraction: 0.0,
        },
        gradient_checkpointing: profile.key.gradient_checkpointing,
    })
}

/// The shape of a pipelined plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineShape {
    /// Pipelines (D).
    pub data_parallel: usize,
    /// Stages per pipeline (P).
    pub stages: usize,
    /// Micro-batches per batch (M).
    pub micro_batches: usize,
    /// The schedule.
    pub schedule: ScheduleKind,
}

/// `shape.data_parallel` pipelines of `shape.stages` stages over `devices` (device
/// `g·P + i` runs stage `i` of pipeline `g`): stage boundaries balanced by
/// [`balance_stages`] for one-chunk schedules (by segment count when interleaved), the
/// step timed by simulating the schedule on the stages' predicted times, plus the
/// all-reduce among each stage's copies after the last backward.
///
/// # Errors
/// [`PlanError::Request`] for a shape the devices, batch or schedule cannot take;
/// [`PlanError::DoesNotFit`]/[`PlanError::Shape`] from the stage search.
pub fn predict_pipeline(
    profile: &ModelProfile,
    devices: &[PlanDevice],
    net: &Interconnect,
    workload: &Workload,
    shape: PipelineShape,
) -> Result<Plan, PlanError> {
    let batch = pipeline_batch(devices, workload, shape)?;
    let PipelineShape {
        data_parallel: d,
        stages: p,
        micro_batches: m,
        schedule: kind,
    } = shape;
    let schedule = Schedule::new(kind, p, m).map_err(|err| PlanError::Request(err.to_string()))?;
    let segments = profile.at(batch.div_ceil(m));
    let positions = StagePositions { devices, shape };
    let split = if kind.chunks() == 1 {
        balanced_split(&segments, &positions, net, workload)?
    } else {
        even_split(segments.len(), p * kind.chunks())?
    };
    let ranges = ranges(&split);
    let (forward, backward, transfer) = stage_times(&segments, &ranges, &positions, net);
    let stage_seconds = forward.iter().zip(&backward).map(|(f, b)| f + b).collect();
    let costs = Costs::per_virtual_stage(forward, backward).with_transfer(transfer);
    let timeline =
        simulate(&schedule, &costs).map_err(|err| PlanError::Request(err.to_string()))?;
    let (reduce, update) = reduce_and_update(profile, &segments, &ranges, &positions, net);
    Ok(Plan {
        model: profile.key.model.clone(),
        devices: devices.iter().map(|d| d.name.clone()).collect(),
        global_batch: workload.global_batch,
        segment_names: profile.segment_names(),
        layout: Layout::Pipeline {
            data_parallel: d,
            stages: p,
            schedule: kind.to_string(),
            micro_batches: m,
            split,
            stage_seconds,
        },
        predicted: Predicted {
            step_seconds: timeline.step_time() + reduce + update,
            device_bytes: pipeline_device_bytes(&segments, &ranges, &positions, workload),
            exposed_communication_seconds: reduce,
            bubble_fraction: timeline.bubble_fraction(),
        },
        gradient_checkpointing: profile.key.gradient_checkpointing,
    })
}

/// The batch each pipeline trains, once `shape` is checked against the devices and the
/// global batch: every device runs one stage, and every micro-batch gets a sample.
///
/// # Errors
/// [`PlanError::Request`] naming what does not divide or is missing.
fn pipeline_batch(
    devices: &[PlanDevice],
    workload: &Workload,
    shape: PipelineShape,
) -> Result<usize, PlanError> {
    let PipelineShape {
        data_parallel: d,
        stages: p,
        micro_batches: m,
        ..
    } = shape;
    if d == 0 || p == 0 || d * p != devices.len() {
        return Err(PlanError::Request(format!(
            "{d} pipelines of {p} stages need {} devices, there are {}",
            d * p,
            devices.len()
        )));
    }
    if !workload.global_batch.is_multiple_of(d) {
        return Err(PlanError::Request(format!(
            "a global batch of {} does not divide into {d} pipelines",
            workload.global_batch
        )));
    }
    let batch = workload.global_batch / d;
    if m == 0 || m > batch {
        return Err(PlanError::Request(format!(
            "{m} micro-batches of a batch of {batch}: each needs at least one sample"
        )));
    }
    Ok(batch)
}

/// The devices of a pipelined plan seen by stage position (device `g·P + i` runs stage `i`
/// of pipeline `g`): every pipeline gets the same split, so each position is planned for
/// all of its copies at once.
struct StagePositions<'a> {
    devices: &'a [PlanDevice],
    shape: PipelineShape,
}

impl StagePositions<'_> {
    /// The copies of stage position `i`, one per pipeline.
    fn copies(&self, i: usize) -> impl Iterator<Item = &PlanDevice> {
        let p = self.shape.stages;
        (0..self.shape.data_parallel).map(move |g| &self.devices[g * p + i])
    }

    /// A stage position is as slow as its slowest copy.
    fn slowdown(&self, i: usize) -> f64 {
        self.copies(i).map(|c| c.slowdown).fold(0.0, f64::max)
    }

    /// A stage position is as small as its smallest copy.
    fn memory(&self, i: usize) -> Option<u64> {
        self.copies(i).filter_map(|c| c.memory).min()
    }

    /// Micro-batches whose activations stage `i` holds at once: under 1F1B at most `P − i`
    /// (it runs a backward after that many forwards), under GPipe and the interleaved
    /// schedule all `M` (they run every forward first).
    fn in_flight(&self, i: usize) -> u64 {
        let (m, p) = (self.shape.micro_batches, self.shape.stages);
        match self.shape.schedule {
            ScheduleKind::OneFOneB => m.min(p - i) as u64,
            ScheduleKind::GPipe | ScheduleKind::Interleaved { .. } => m as u64,
        }
    }
}

/// Segments per stage for a one-chunk schedule, balanced by [`balance_stages`] on each
/// position's speed, memory and micro-batches in flight.
///
/// # Errors
/// [`PlanError::DoesNotFit`]/[`PlanError::Shape`] from the stage search.
fn balanced_split(
    segments: &[SegmentAt],
    positions: &StagePositions,
    net: &Interconnect,
    workload: &Workload,
) -> Result<Vec<usize>, PlanError> {
    let costs: Vec<SegmentCost> = segments
        .iter()
        .map(|s| SegmentCost {
            seconds: s.forward + s.backward,
            state_bytes: state_bytes(s, workload),
            activation_bytes: s.activation_bytes.unwrap_or(0),
            output_bytes: s.output_bytes,
        })
        .collect();
    let capacities: Vec<DeviceCapacity> = (0..positions.shape.stages)
        .map(|i| DeviceCapacity {
            slowdown: positions.slowdown(i),
            memory: positions.memory(i),
            in_flight: positions.in_flight(i),
        })
        .collect();
    Ok(
        balance_stages(&costs, &capacities, net.transfer_seconds_per_byte)?
            .stages
            .iter()
            .map(|r| r.len())
            .collect(),
    )
}

/// Segments per virtual stage for an interleaved schedule: by segment count (the earlier
/// stages take one more when they do not divide evenly), as [`balance_stages`] cuts one
/// contiguous stage per device, not several chunks.
///
/// # Errors
/// [`PlanError::Shape`] when there are fewer segments than virtual stages.
fn even_split(segments: usize, virtual_stages: usize) -> Result<Vec<usize>, PlanError> {
    if virtual_stages > segments {
        return Err(PlanError::Shape {
            devices: virtual_stages,
            segments,
        });
    }
    Ok((0..virtual_stages)
        .map(|v| segments / virtual_stages + usize::from(v < segments % virtual_stages))
        .collect())
}

/// Each virtual stage's forward and backward seconds on its device (virtual stage `v` runs
/// on position `v mod P`), and the slowest hand-over between stages: what the schedule's
/// simulation needs.
fn stage_times(
    segments: &[SegmentAt],
    ranges: &[Range<usize>],
    positions: &StagePositions,
    net: &Interconnect,
) -> (Vec<f64>, Vec<f64>, f64) {
    let (mut forward, mut backward) = (Vec::new(), Vec::new());
    let mut transfer: f64 = 0.0;
    for (v, range) in ranges.iter().enumerate() {
        let slowdown = positions.slowdown(v % positions.shape.stages);
        let run = &segments[range.clone()];
        forward.push(run.iter().map(|s| s.forward).sum::<f64>() * slowdown);
        backward.push(run.iter().map(|s| s.backward).sum::<f64>() * slowdown);
        if v + 1 < ranges.len() {
            let bytes = segments[range.end - 1].output_bytes as f64;
            transfer = transfer.max(bytes * net.transfer_seconds_per_byte);
        }
    }
    (forward, backward, transfer)
}

/// Seconds the step takes after the schedule ends: the all-reduce and the update.
///
/// Each stage's copies add their gradients once its last backward is done, then update
/// their parameters; the largest stage's reduction and update end the step (kiln's
/// pipeline does not overlap them with other stages' backward yet).
fn reduce_and_update(
    profile: &ModelProfile,
    segments: &[SegmentAt],
    ranges: &[Range<usize>],
    positions: &StagePositions,
    net: &Interconnect,
) -> (f64, f64) {
    let mut reduce: f64 = 0.0;
    let mut update: f64 = 0.0;
    for (v, range) in ranges.iter().enumerate() {
        let trainable: u64 = segments[range.clone()]
            .iter()
            .map(|s| s.trainable_bytes)
            .sum();
        reduce = reduce.max(net.all_reduce(positions.shape.data_parallel, trainable));
        let slowdown = positions.slowdown(v % positions.shape.stages);
        update = update.max(trainable as f64 * profile.update_seconds_per_byte * slowdown);
    }
    (reduce, update)
}

/// Predicted bytes on each device: its stages' state plus the activations of the
/// micro-batches they hold at once (`None` where a segment's activations were not measured);
/// every copy of a position holds the same.
fn pipeline_device_bytes(
    segments: &[SegmentAt],
    ranges: &[Range<usize>],
    positions: &StagePositions,
    workload: &Workload,
) -> Vec<Option<u64>> {
    let p = positions.shape.stages;
    let mut per_position = vec![Some(0u64); p];
    for (v, range) in ranges.iter().enumerate() {
        let position = v % p;
        let held = segments[range.clone()]
            .iter()
            .map(|s| {
                s.activation_bytes
                    .map(|a| state_bytes(s, workload) + positions.in_flight(position) * a)
            })
            .sum::<Option<u64>>();
        per_position[position] = per_position[position].zip(held).map(|(a, b)| a + b);
    }
    (0..positions.shape.data_parallel * p)
        .map(|i| per_position[i % p])
        .collect()
}
