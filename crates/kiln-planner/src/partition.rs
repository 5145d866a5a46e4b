//! Stage boundaries by dynamic programming over contiguous runs of segments.

use std::ops::Range;

/// What one segment costs per micro-batch, measured on a reference device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegmentCost {
    /// Forward plus backward seconds on the reference device.
    pub seconds: f64,
    /// Bytes of its parameters, gradients and optimizer state together.
    pub state_bytes: u64,
    /// Bytes of the activations it keeps for backward, per micro-batch in flight.
    pub activation_bytes: u64,
    /// Bytes of its output (what crosses to the next stage when a stage ends here).
    pub output_bytes: u64,
}

/// One device of the pipeline, in stage order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceCapacity {
    /// Its time for a given work ÷ the reference device's (2.0: twice as slow).
    pub slowdown: f64,
    /// Bytes it may hold; `None`: unlimited.
    pub memory: Option<u64>,
    /// Micro-batches of activations it holds at once as stage `i` (1F1B: `min(M, P − i)`;
    /// GPipe: `M`).
    pub in_flight: u64,
}

/// The chosen stages.
#[derive(Debug, Clone, PartialEq)]
pub struct StagePlan {
    /// Segments of each stage, in order.
    pub stages: Vec<Range<usize>>,
    /// Each stage's time per micro-batch on its device, its outgoing transfer included.
    pub stage_seconds: Vec<f64>,
    /// Each stage's memory on its device.
    pub stage_bytes: Vec<u64>,
}

impl StagePlan {
    /// The slowest stage's time: what bounds the pipeline's throughput.
    pub fn bottleneck(&self) -> f64 {
        self.stage_seconds.iter().copied().fold(0.0, f64::max)
    }
}

/// Why no plan fits.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// More stages than segments, or none.
    #[error("{devices} stages for {segments} segments: every stage needs at least one segment")]
    Shape {
        /// Stages asked for.
        devices: usize,
        /// Segments of the model.
        segments: usize,
    },
    /// No split fits the memory limits.
    #[error(
        "no split of the model into {devices} stages fits the devices' memory: the largest segment ({name}, index {segment}) alone needs {segment_bytes} bytes, the largest device holds {largest_device} bytes"
    )]
    DoesNotFit {
        /// Stages asked for.
        devices: usize,
        /// The segment that needs the most memory on its own.
        segment: usize,
        /// Its name (`segment N` when the costs carry no names).
        name: String,
        /// Its bytes (state plus one micro-batch of activations).
        segment_bytes: u64,
        /// The largest memory limit among the devices.
        largest_device: u64,
    },
    /// Every segment fits some device, but no contiguous split fits them all.
    #[error(
        "no split of the model into {} stages fits the devices' memory: the closest needs {} against limits {}",
        stage_bytes.len(),
        megabytes(stage_bytes.iter().map(|&b| Some(b))),
        megabytes(limits.iter().copied())
    )]
    NoSplitFits {
        /// Bytes of each stage in the split closest to fitting.
        stage_bytes: Vec<u64>,
        /// Each stage device's limit.
        limits: Vec<Option<u64>>,
    },
    /// A plan request the devices, batch or schedule cannot take.
    #[error("{0}")]
    Request(String),
    /// Memory limits were given but the profile could not measure activations.
    #[error(
        "a memory limit was given, but the profile has no activation sizes: on the CPU install kiln's TrackingAllocator as the global allocator so the profiler can measure them"
    )]
    Unmeasured,
    /// The plan asked for does not fit the devices' memory.
    #[error("plan {plan} does not fit: {details}")]
    ForcedDoesNotFit {
        /// The plan, as `dp=2` or `pp=2 1f1b M=4`.
        plan: String,
        /// Each device over its limit, with its predicted bytes.
        details: String,
    },
    /// A saved plan does not belong to this run.
    #[error("plan file: {0}")]
    Mismatch(String),
    /// A profile the planner asked for could not be taken.
    #[error(transparent)]
    Profile(#[from] crate::ProfileError),
    /// Nothing fits, not even with the memory lever (gradient checkpointing).
    #[error("{plain}; with gradient checkpointing (recomputing activations) too: {recomputing}")]
    EvenRecomputing {
        /// Why nothing fits as the model is.
        plain: Box<PlanError>,
        /// Why nothing fits with the lever.
        recomputing: Box<PlanError>,
    },
}

impl PlanError {
    /// Whether the error is that the devices' memory is too small (what the memory lever can
    /// change), not a request that cannot be planned at all.
    pub fn is_memory(&self) -> bool {
        matches!(
            self,
            Self::DoesNotFit { .. } | Self::NoSplitFits { .. } | Self::ForcedDoesNotFit { .. }
        )
    }
}

/// Cuts `segments` into `devices.len()` contiguous stages (stage `i` on `devices[i]`) so that
/// the slowest stage is as fast as possible, each stage fitting its device's memory. A stage's
/// time is its segments' seconds × its device's slowdown, plus `seconds_per_byte` × the bytes
/// its last segment sends on (none for the last stage). Ties go to the earliest boundaries,
/// so equal costs always give the same plan. `O(P·N²)` for P devices and N segments.
///
/// # Errors
/// [`PlanError::Shape`] without devices or with more devices than segments;
/// [`PlanError::DoesNotFit`] when no split fits the memory limits.
pub fn balance_stages(
    segments: &[SegmentCost],
    devices: &[DeviceCapacity],
    seconds_per_byte: f64,
) -> Result<StagePlan, PlanError> {
    let (n, p) = (segments.len(), devices.len());
    if p == 0 || p > n {
        return Err(PlanError::Shape {
            devices: p,
            segments: n,
        });
    }
    let cost = |stage: usize, range: Range<usize>| -> Option<(f64, u64)> {
        let device = devices[stage];
        let work: f64 = segments[range.clone()].iter().map(|s| s.seconds).sum();
        let transfer = if stage + 1 < p {
            segments[range.end - 1].output_bytes as f64 * seconds_per_byte
        } else {
            0.0
        };
        let bytes = stage_bytes(segments, devices, stage, range);
        let fits = device.memory.is_none_or(|limit| bytes <= limit);
        fits.then_some((work * device.slowdown + transfer, bytes))
    };
    let time = |stage: usize, range: Range<usize>| cost(stage, range).map(|(t, _)| t);
    let Some(stages) = min_max_split(n, p, time) else {
        return Err(no_split_fits(segments, devices));
    };
    let (stage_seconds, stage_bytes) = stages
        .iter()
        .enumerate()
        .map(|(s, r)| cost(s, r.clone()).expect("the chosen stages fit"))
        .unzip();
    Ok(StagePlan {
        stages,
        stage_seconds,
        stage_bytes,
    })
}

/// Bytes stage `stage` holds with `range`: state, and activations for its micro-batches in
/// flight.
fn stage_bytes(
    segments: &[SegmentCost],
    devices: &[DeviceCapacity],
    stage: usize,
    range: Range<usize>,
) -> u64 {
    segments[range]
        .iter()
        .map(|s| s.state_bytes + devices[stage].in_flight * s.activation_bytes)
        .sum()
}

/// The contiguous split of `n` segments into `p` non-empty stages minimising the largest
/// `cost(stage, range)` (`None`: not allowed), ties to the earliest boundaries; `None` when
/// no split is allowed.
fn min_max_split(
    n: usize,
    p: usize,
    cost: impl Fn(usize, Range<usize>) -> Option<f64>,
) -> Option<Vec<Range<usize>>> {
    // best[s][j]: the smallest bottleneck of stages 0..s covering segments 0..j, and the
    // start of stage s − 1 that achieves it.
    let mut best = vec![vec![None::<(f64, usize)>; n + 1]; p + 1];
    best[0][0] = Some((0.0, 0));
    for s in 1..=p {
        // Stage s − 1 ends at j; the stages after it need at least one segment each.
        for j in s..=n - (p - s) {
            for i in (s - 1)..j {
                let Some((before, _)) = best[s - 1][i] else {
                    continue;
                };
                let Some(value) = cost(s - 1, i..j) else {
                    continue;
                };
                let bottleneck = before.max(value);
                if best[s][j].is_none_or(|(b, _)| bottleneck < b) {
                    best[s][j] = Some((bottleneck, i));
                }
            }
        }
    }
    best[p][n]?;
    let mut stages = vec![0..0; p];
    let mut end = n;
    for s in (1..=p).rev() {
        let (_, start) = best[s][end].expect("a reachable state has a predecessor");
        stages[s - 1] = start..end;
        end = start;
    }
    Some(stages)
}

/// Why no split fits: a segment too large for any device on its own, else the split that
/// comes closest (the smallest worst ratio of bytes to limit) and its bytes.
fn no_split_fits(segments: &[SegmentCost], devices: &[DeviceCapacity]) -> PlanError {
    let too_big = does_not_fit(segments, devices);
    let PlanError::DoesNotFit {
        segment_bytes,
        largest_device,
        ..
    } = &too_big
    else {
        unreachable!("does_not_fit describes a segment")
    };
    if segment_bytes > largest_device {
        return too_big;
    }
    let ratio = |stage: usize, range: Range<usize>| {
        let bytes = stage_bytes(segments, devices, stage, range) as f64;
        Some(
            devices[stage]
                .memory
                .map_or(0.0, |limit| bytes / limit.max(1) as f64),
        )
    };
    let closest = min_max_split(segments.len(), devices.len(), ratio)
        .expect("without limits every split is allowed");
    PlanError::NoSplitFits {
        stage_bytes: closest
            .iter()
            .enumerate()
            .map(|(s, r)| stage_bytes(segments, devices, s, r.clone()))
            .collect(),
        limits: devices.iter().map(|d| d.memory).collect(),
    }
}

fn does_not_fit(segments: &[SegmentCost], devices: &[DeviceCapacity]) -> PlanError {
    let bytes: Vec<u64> = segments
        .iter()
        .map(|s| s.state_bytes + s.activation_bytes)
        .collect();
    largest_segment(&bytes, devices.iter().map(|d| d.memory), |i| {
        format!("segment {i}")
    })
}

/// [`PlanError::DoesNotFit`] for the segment with the most of `bytes` (named by `name`)
/// against the largest of `limits` (`None`: no limit).
pub(crate) fn largest_segment(
    bytes: &[u64],
    limits: impl Iterator<Item = Option<u64>>,
    name: impl Fn(usize) -> String,
) -> PlanError {
    let limits: Vec<Option<u64>> = limits.collect();
    let (segment, segment_bytes) = bytes
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|&(_, bytes)| bytes)
        .unwrap_or((0, 0));
    PlanError::DoesNotFit {
        devices: limits.len(),
        segment,
        name: name(segment),
        segment_bytes,
        largest_device: limits
            .iter()
            .map(|m| m.unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0),
    }
}

/// `[12.0 MB, none]`.
fn megabytes(bytes: impl Iterator<Item = Option<u64>>) -> String {
    let parts: Vec<String> = bytes
        .map(|b| b.map_or("none".into(), human_bytes))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// `512 B`, `40.0 KB`, `12.3 MB`, `1.50 GB` (decimal units).
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b < 1e3 {
        format!("{bytes} B")
    } else if b < 1e6 {
        format!("{:.1} KB", b / 1e3)
    } else if b < 1e9 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.2} GB", b / 1e9)
    }
}
