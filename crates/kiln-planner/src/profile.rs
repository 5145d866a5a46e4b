//! Measuring each segment of a model on a device: forward and backward time, parameter
//! bytes, and the activations it passes on and keeps for backward.

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor};
use kiln_core::{Activation, ImageClassifier, SegmentId, Segmented, segment_param_infos};
use kiln_data::{Batch, ImageBatch};
use kiln_train::{Classification, Objective, objective_loss};
use serde::{Deserialize, Serialize};

use crate::memory::live_bytes;

/// What one segment costs for one batch of the profiled size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentProfile {
    /// `input`, `middle 3`, `output`.
    pub name: String,
    /// Median forward seconds.
    pub forward_seconds: f64,
    /// Median backward seconds (the loss's included on the output segment).
    pub backward_seconds: f64,
    /// Bytes of its trainable parameters (f32).
    pub trainable_bytes: u64,
    /// Bytes of its other float state (batch-norm statistics).
    pub buffer_bytes: u64,
    /// Bytes of its output: what crosses a stage boundary after it.
    pub output_bytes: u64,
    /// Bytes its forward keeps alive until its backward (its output included), the median
    /// over runs; `None` where the device's memory cannot be read (see
    /// [`TrackingAllocator`](crate::TrackingAllocator)).
    pub activation_bytes: Option<u64>,
}

/// Every segment of a model, profiled at one batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchProfile {
    /// Samples per batch.
    pub batch: usize,
    /// Segments in forward order.
    pub segments: Vec<SegmentProfile>,
}

/// How to profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileOptions {
    /// Timed runs; each segment's median is kept.
    pub runs: usize,
    /// Untimed runs first (caches, thread pools, allocator pages).
    pub warmup: usize,
    /// Compute threads (a pool of its own); `None`: the caller's rayon pool.
    pub threads: Option<usize>,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        Self {
            runs: 5,
            warmup: 1,
            threads: None,
        }
    }
}

/// Why a profile could not be taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// The device failed while running the model.
    #[error("profiling on {device}: the device failed: {message}")]
    Device {
        /// The device, as Burn prints it.
        device: String,
        /// What went wrong.
        message: String,
    },
    /// The options or inputs cannot give a profile.
    #[error("profiling: {0}")]
    Input(String),
}

/// Profiles every segment of the image classifier `model` on the device of `images` (an
/// autodiff device): [`profile_segments_with`] for [`Classification`], the loss
/// cross-entropy against `labels`.
///
/// # Errors
/// As [`profile_segments_with`].
pub fn profile_segments<M>(
    model: &M,
    images: Tensor<4>,
    labels: Tensor<1, Int>,
    options: &ProfileOptions,
) -> Result<BatchProfile, ProfileError>
where
    M: ImageClassifier + Segmented<Input = Tensor<4>, Output = Tensor<2>> + Sync,
{
    let device = images.device();
    let batch = image_batch(images, labels);
    profile_segments_with(model, &Classification, &batch, &device, options)
}

/// `images` and `labels` as a batch (indices in order: the profile does not read them).
pub(crate) fn image_batch(images: Tensor<4>, labels: Tensor<1, Int>) -> ImageBatch {
    ImageBatch {
        indices: (0..images.dims()[0]).collect(),
        images,
        labels,
    }
}

/// Profiles every segment of `model` (any [`Segmented`] model, for any [`Objective`]) on
/// `batch`, which lies on `device` (an autodiff device): `options.warmup` untimed runs, then
/// `options.runs` timed ones, each segment's forward and backward timed on its own (segments
/// are cut apart at their boundaries, as pipeline stages cut them) and the medians kept.
/// The objective's loss is part of the output segment. (In f32: the model input and output
/// are not cast.)
///
/// Profile with the threads a replica or stage will have ([`ProfileOptions::threads`]), and
/// while nothing else allocates: on the CPU the kept activations are the heap's growth.
///
/// # Errors
/// [`ProfileError::Input`] for zero runs or an empty batch; [`ProfileError::Device`] when
/// the device fails or the model panics on it.
pub fn profile_segments_with<M, O>(
    model: &M,
    objective: &O,
    batch: &O::Batch,
    device: &Device,
    options: &ProfileOptions,
) -> Result<BatchProfile, ProfileError>
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output> + Sync,
{
    let samples = batch.samples();
    if options.runs == 0 || samples == 0 {
        return Err(ProfileError::Input(format!(
            "needs at least one run and one sample (runs {}, batch {samples})",
            options.runs
        )));
    }
    if let Some(threads) = options.threads {
        let pool = pool(threads)?;
        let options = ProfileOptions {
            threads: None,
            ..options.clone()
        };
        // The pool's thread takes its own handles (a batch need not be `Sync`).
        let (batch, device) = (batch.clone(), device.clone());
        return pool
            .install(move || profile_segments_with(model, objective, &batch, &device, &options));
    }
    let ids = model.segments();
    let mut runs = Vec::with_capacity(options.runs);
    for run in 0..options.warmup + options.runs {
        // A model that panics on this device is this device's failure, reported as an error.
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_once(model, &ids, (objective, batch), device)
        }));
        let measured = attempt.unwrap_or_else(|panic| {
            Err(ProfileError::Device {
                device: format!("{device:?}"),
                message: format!("the model panicked: {}", kiln_core::panic_message(&*panic)),
            })
        })?;
        if run >= options.warmup {
            runs.push(measured);
        }
    }
    let segments = ids
        .iter()
        .enumerate()
        .map(|(index, &id)| {
            let (trainable_bytes, buffer_bytes) = param_bytes(model, id);
            let column = |pick: fn(&Measured) -> f64| {
                median(runs.iter().map(|run| pick(&run[index])).collect())
            };
            let activation_bytes = runs
                .iter()
                .map(|run| run[index].activation_bytes)
                .collect::<Option<Vec<_>>>()
                .map(|bytes| median(bytes.iter().map(|&b| b as f64).collect()) as u64);
            SegmentProfile {
                name: segment_name(id),
                forward_seconds: column(|m| m.forward),
                backward_seconds: column(|m| m.backward),
                trainable_bytes,
                buffer_bytes,
                output_bytes: runs[0][index].output_bytes,
                activation_bytes,
            }
        })
        .collect();
    Ok(BatchProfile {
        batch: samples,
        segments,
    })
}

/// A compute pool of `threads` threads for profiling.
pub(crate) fn pool(threads: usize) -> Result<rayon::ThreadPool, ProfileError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("kiln-profile-{i}"))
        .build()
        .map_err(|err| ProfileError::Input(format!("a pool of {threads} threads: {err}")))
}

/// One run's measurements of one segment.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    forward: f64,
    backward: f64,
    output_bytes: u64,
    activation_bytes: Option<u64>,
}

/// What a segment's forward left for its backward.
enum Kept<H> {
    Hidden { leaf: Option<H>, output: H },
    Loss { leaf: H, loss: Box<Tensor<1>> },
}

fn run_once<M, O>(
    model: &M,
    ids: &[SegmentId],
    (objective, batch): (&O, &O::Batch),
    device: &Device,
) -> Result<Vec<Measured>, ProfileError>
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output>,
{
    let sync = || {
        device.sync().map_err(|err| ProfileError::Device {
            device: format!("{device:?}"),
            message: err.to_string(),
        })
    };
    sync()?;
    let mut measured = vec![Measured::default(); ids.len()];
    let mut kept: Vec<Kept<M::Hidden>> = Vec::with_capacity(ids.len());
    let mut input = Some(objective.input(batch));
    let mut carried: Option<M::Hidden> = None;
    for (index, &id) in ids.iter().enumerate() {
        let before = live_bytes(device);
        let start = Instant::now();
        let leaf = carried.take().map(Activation::detach_boundary);
        let item = match (id, leaf) {
            (SegmentId::Input, _) => {
                let input = input.take().expect("the input segment comes first, once");
                Kept::Hidden {
                    leaf: None,
                    output: model.forward_input(input),
                }
            }
            (SegmentId::Middle(k), Some(leaf)) => Kept::Hidden {
                output: model.forward_middle(k, leaf.clone()),
                leaf: Some(leaf),
            },
            (SegmentId::Output, Some(leaf)) => Kept::Loss {
                loss: Box::new(objective_loss(
                    objective,
                    &model.forward_output(leaf.clone()),
                    batch,
                )),
                leaf,
            },
            (_, None) => unreachable!("segments after the first receive a hidden activation"),
        };
        sync()?;
        measured[index].forward = start.elapsed().as_secs_f64();
        let after = live_bytes(device);
        measured[index].activation_bytes = before.zip(after).map(|(b, a)| a.saturating_sub(b));
        if let Kept::Hidden { output, .. } = &item {
            measured[index].output_bytes = output.size_bytes() as u64;
            carried = Some(output.clone());
        }
        kept.push(item);
    }
    let mut upstream: Option<M::Hidden> = None;
    for index in (0..ids.len()).rev() {
        let item = kept.pop().expect("one kept forward per segment");
        let start = Instant::now();
        let (leaf, grads) = match item {
            Kept::Loss { leaf, loss } => (Some(leaf), loss.backward()),
            Kept::Hidden { leaf, output } => {
                let gradient = upstream
                    .take()
                    .expect("the later segment passed a gradient");
                (leaf, output.backward_with(gradient))
            }
        };
        upstream = match &leaf {
            Some(leaf) => Some(leaf.boundary_grad(&grads).ok_or_else(|| {
                ProfileError::Input(format!(
                    "segment {}: its output does not depend on its input",
                    segment_name(ids[index])
                ))
            })?),
            None => None,
        };
        drop(grads);
        sync()?;
        measured[index].backward = start.elapsed().as_secs_f64();
    }
    Ok(measured)
}

/// Bytes of the trainable parameters and of the other float state of segment `id`.
fn param_bytes<M: Segmented>(model: &M, id: SegmentId) -> (u64, u64) {
    segment_param_infos(model, id)
        .iter()
        .fold((0, 0), |(trainable, buffers), info| {
            let bytes = 4 * info.numel() as u64;
            if info.trainable {
                (trainable + bytes, buffers)
            } else {
                (trainable, buffers + bytes)
            }
        })
}

/// How a segment is named in profiles and plans.
pub fn segment_name(id: SegmentId) -> String {
    match id {
        SegmentId::Input => "input".into(),
        SegmentId::Middle(k) => format!("middle {k}"),
        SegmentId::Output => "output".into(),
    }
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
