//! One stage's share of the model: its chunks of segments, their forward and backward, and
//! its gradients.

use std::collections::HashSet;
use std::ops::Range;

use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Gradients, Tensor};
use kiln_amp::{AmpStats, MixedPrecision};
use kiln_comm::{CommWorker, Communicator, ReduceOp};
use kiln_core::{
    Activation, FlatLayout, GradWriter, ParamInfo, SegmentId, Segmented, grads_from_flat,
    param_infos, read_params, segment_param_infos,
};
use kiln_train::{MeanGradient, Objective, objective_loss};

use crate::runtime::PipelineError;
use crate::runtime::empty::{float_bytes, keep_only};
use crate::runtime::stage_gradient::{StageGradient, agree_over_stages, chunk_ranges};
use crate::runtime::tied::{StageTies, TiedGradients, segment_ids};

/// What a chunk's forward left for its backward.
pub(crate) struct Forwarded<H> {
    /// The chunk's input leaf (its gradient goes to the previous virtual stage).
    input: Option<H>,
    /// The chunk's output, or the loss on the last virtual stage.
    output: Output<H>,
}

enum Output<H> {
    Hidden(H),
    Loss(Box<Tensor<1>>),
}

impl<H: Clone> Forwarded<H> {
    /// The output to pass to the next virtual stage (a value, without the graph it
    /// keeps here for backward); none for the loss.
    pub(crate) fn output_for_next(&self) -> Option<H> {
        match &self.output {
            Output::Hidden(hidden) => Some(hidden.clone()),
            Output::Loss(_) => None,
        }
    }
}

/// What flows into a chunk: the model's input (first virtual stage) or an activation.
pub(crate) enum Input<I, H> {
    Model(Box<I>),
    Hidden(H),
}

/// A stage: the model with only its segments' parameters, and their summed gradients.
pub(crate) struct Stage<M> {
    pub model: M,
    segments: Vec<SegmentId>,
    /// Segment indices of each chunk (chunk `c` is virtual stage `c·P + stage`).
    chunks: Vec<Range<usize>>,
    layout: FlatLayout,
    flat: Vec<f32>,
    /// Per chunk, the ranges of `flat` its parameters fill: `None` unless the chunks' ranges
    /// are disjoint and cover `flat` (then its copies cannot add the chunks' gradients
    /// apart).
    chunk_ranges: Option<Vec<Vec<Range<usize>>>>,
    /// Bytes of the stage's parameters and buffers as held.
    pub param_bytes: usize,
    /// The most bytes its threads held at once over its steps, on a CPU device with
    /// [`kiln_core::TrackingAllocator`] installed (set once trained).
    pub peak_bytes: Option<u64>,
    /// Each compute takes this many times its time (see `PipelineConfig::emulated_slowdown`).
    pub emulated_slowdown: f64,
    /// The id of every parameter and buffer it owns (holds and saves), by whole-model path:
    /// not the copies of tied parameters another stage owns.
    pub owned_ids: std::collections::BTreeMap<String, u64>,
    /// Tied pairs `(owner, reader)` whose reader it runs (see `tied.rs`).
    reads: Vec<(SegmentId, SegmentId)>,
    /// With a tie across stages: the shared parameters' gradients and copies.
    tied: Option<TiedGradients>,
    /// What mixed precision did (steps, skipped steps, the loss scale), once trained.
    pub amp: AmpStats,
}

impl<M> Stage<M> {
    /// Waits as long as a device `emulated_slowdown` times slower would have needed beyond
    /// `elapsed`; returns the emulated compute time.
    pub(crate) fn emulate(&self, elapsed: std::time::Duration) -> std::time::Duration {
        if self.emulated_slowdown > 1.0 {
            std::thread::sleep(elapsed.mul_f64(self.emulated_slowdown - 1.0));
        }
        elapsed.mul_f64(self.emulated_slowdown)
    }

    /// The trainable parameters' layout (for reading the trained values).
    pub(crate) fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// Segment indices of each of its chunks.
    pub(crate) fn chunks(&self) -> &[Range<usize>] {
        &self.chunks
    }
}

/// Where running a chunk's segments ended.
enum Reached<H, Y> {
    /// A hidden activation, for the next virtual stage.
    Hidden(H),
    /// The model's output: the chunk holds the output segment.
    Output(Box<Y>),
}

/// What evaluating a chunk gives.
pub(crate) enum Evaluated<H> {
    /// The activation for the next virtual stage.
    Hidden(H),
    /// On the model's last segment: the mean loss and the objective's correct count.
    Scored { loss: f32, correct: usize },
}

/// Runs `model`'s segments `range` (middles, then perhaps the output) on `hidden`.
fn through<M: Segmented>(
    model: &M,
    segments: &[SegmentId],
    range: Range<usize>,
    mut hidden: M::Hidden,
) -> Reached<M::Hidden, M::Output> {
    for index in range {
        match segments[index] {
            SegmentId::Input => unreachable!("the input segment is first and reads the input"),
            SegmentId::Middle(k) => hidden = model.forward_middle(k, hidden),
            SegmentId::Output => {
                return Reached::Output(Box::new(model.forward_output(hidden)));
            }
        }
    }
    Reached::Hidden(hidden)
}

/// The parameters and buffers (whole-model paths) a stage holds: those of `model`'s
/// segments in `chunks`, and its copies of tied parameters other stages own (`ties`).
pub(crate) fn held_infos<M: Segmented>(
    model: &M,
    chunks: &[Range<usize>],
    ties: &StageTies,
) -> Vec<ParamInfo> {
    let segments = model.segments();
    let mut keep: HashSet<_> = chunks
        .iter()
        .flat_map(|range| range.clone())
        .flat_map(|index| segment_param_infos(model, segments[index]))
        .map(|info| info.id)
        .collect();
    keep.extend(segment_ids(model, &ties.copies));
    // Whole-model paths (a segment's own paths are relative to it).
    param_infos(model)
        .into_iter()
        .filter(|info| keep.contains(&info.id))
        .collect()
}

impl<M: Segmented> Stage<M> {
    /// The stage of `model` owning the segments of `chunks`, and holding copies of the
    /// tied parameters `ties` names; every other parameter is emptied.
    pub(crate) fn new(model: M, chunks: Vec<Range<usize>>, ties: StageTies) -> Self {
        let segments = model.segments();
        let held = held_infos(&model, &chunks, &ties);
        let keep: HashSet<_> = held.iter().map(|info| info.id).collect();
        let copies = segment_ids(&model, &ties.copies);
        let owned_ids = held
            .iter()
            .filter(|info| !copies.contains(&info.id))
            .map(|info| (info.path.clone(), info.id.val()))
            .collect();
        let layout = FlatLayout::new(held.into_iter().filter(|info| info.trainable));
        let chunk_ranges = chunk_ranges(&model, (&segments, &ties.reads), &chunks, &layout);
        let tied = TiedGradients::new(&model, &ties, &layout);
        let model = keep_only(model, &keep);
        let param_bytes = float_bytes(&model);
        Self {
            model,
            segments,
            chunks,
            flat: vec![0.0; layout.len()],
            chunk_ranges,
            layout,
            param_bytes,
            peak_bytes: None,
            emulated_slowdown: 1.0,
            owned_ids,
            reads: ties.reads,
            tied,
            amp: AmpStats::default(),
        }
    }

    /// Runs chunk `chunk`'s segments on `input`; on the model's last segment, the
    /// objective's loss against `batch` (returns its value and correct count too).
    ///
    /// `working` is the step's working copy under mixed precision (`None`: the f32 master
    /// itself); `precision` casts the model input, widens the output to f32 and scales the
    /// loss.
    pub(crate) fn forward<O>(
        &self,
        working: Option<&M>,
        (precision, objective): (&MixedPrecision, &O),
        chunk: usize,
        input: Input<M::Input, M::Hidden>,
        batch: Option<&O::Batch>,
    ) -> (Forwarded<M::Hidden>, Option<(f32, usize)>)
    where
        O: Objective,
        M: Segmented<Input = O::Input, Output = O::Output>,
    {
        let model = working.unwrap_or(&self.model);
        let range = self.chunks[chunk].clone();
        // The first chunk starts with the input segment, which reads the model input; the
        // others cut their input off the graph it came from, keeping the cut to return its
        // gradient.
        let (hidden, leaf, rest) = match input {
            Input::Model(input) => {
                debug_assert_eq!(self.segments[range.start], SegmentId::Input);
                (
                    model.forward_input(precision.input(*input)),
                    None,
                    range.start + 1..range.end,
                )
            }
            Input::Hidden(hidden) => {
                let cut = hidden.detach_boundary();
                (cut.clone(), Some(cut), range)
            }
        };
        match through(model, &self.segments, rest, hidden) {
            Reached::Hidden(hidden) => (
                Forwarded {
                    input: leaf,
                    output: Output::Hidden(hidden),
                },
                None,
            ),
            Reached::Output(output) => {
                let batch = batch.expect("the last stage has the targets");
                let output = precision.logits(*output);
                let loss = objective_loss(objective, &output, batch);
                let value = loss.clone().into_scalar::<f32>();
                let correct = objective.correct(&output, batch);
                let forwarded = Forwarded {
                    input: leaf,
                    output: Output::Loss(Box::new(precision.scaled_loss(loss))),
                };
                (forwarded, Some((value, correct)))
            }
        }
    }

    /// Chunk `chunk`'s forward on `model` (the stage's inference copy, no graph): its output,
    /// or on the model's last segment the objective's loss and correct count against
    /// `batch`.
    pub(crate) fn evaluate<O>(
        &self,
        (model, objective): (&M, &O),
        chunk: usize,
        input: Input<M::Input, M::Hidden>,
        batch: Option<&O::Batch>,
    ) -> Evaluated<M::Hidden>
    where
        O: Objective,
        M: Segmented<Input = O::Input, Output = O::Output>,
    {
        let range = self.chunks[chunk].clone();
        let (hidden, rest) = match input {
            Input::Model(input) => (model.forward_input(*input), range.start + 1..range.end),
            Input::Hidden(hidden) => (hidden, range),
        };
        match through(model, &self.segments, rest, hidden) {
            Reached::Hidden(hidden) => Evaluated::Hidden(hidden),
            Reached::Output(output) => {
                let batch = batch.expect("the last stage has the targets");
                let loss = objective_loss(objective, &output, batch);
                Evaluated::Scored {
                    loss: loss.into_scalar::<f32>(),
                    correct: objective.correct(&output, batch),
                }
            }
        }
    }

    /// Backward of chunk `chunk` from its output's gradient `upstream` (none on the last
    /// virtual stage), adding its parameters' gradients (of `working`, the step's working
    /// copy, when there is one) widened to f32 × `weight`; returns the gradient of its input.
    pub(crate) fn backward(
        &mut self,
        working: Option<&M>,
        stage: usize,
        chunk: usize,
        forwarded: Forwarded<M::Hidden>,
        upstream: Option<M::Hidden>,
        weight: f32,
    ) -> Result<Option<M::Hidden>, PipelineError> {
        let mut grads: Gradients = match (forwarded.output, upstream) {
            (Output::Loss(loss), _) => loss.backward(),
            (Output::Hidden(output), Some(upstream)) => output.backward_with(upstream),
            (Output::Hidden(_), None) => unreachable!("the schedule receives a gradient first"),
        };
        let input_grad = match &forwarded.input {
            Some(leaf) => Some(leaf.boundary_grad(&grads).ok_or_else(|| PipelineError::Stage {
                stage,
                message: format!(
                    "chunk {chunk}: its output does not depend on its input (no gradient reaches the boundary)"
                ),
            })?),
            None => None,
        };
        let model = working.unwrap_or(&self.model);
        let mut writer = GradWriter {
            grads: &mut grads,
            layout: &self.layout,
            flat: &mut self.flat,
            scale: weight,
            accumulate: true,
        };
        for index in self.chunks[chunk].clone() {
            let segment = self.segments[index];
            model.visit_segment(segment, &mut writer);
            // A reader's share of the tied parameters it reads (the owner's own share is
            // collected by the owner's backward: each gradient is taken once).
            for (owner, _) in self.reads.iter().filter(|(_, reader)| *reader == segment) {
                model.visit_segment(*owner, &mut writer);
            }
        }
        Ok(input_grad)
    }

    /// Per chunk, the ranges of the gradient buffer its parameters fill, when the chunks'
    /// are disjoint and cover the buffer.
    pub(crate) fn chunk_grad_ranges(&self) -> Option<Vec<Vec<Range<usize>>>> {
        self.chunk_ranges.clone()
    }

    /// The gradient buffer's length.
    pub(crate) fn grad_len(&self) -> usize {
        self.flat.len()
    }

    /// The summed gradients in `ranges`, concatenated.
    pub(crate) fn grads_in(&self, ranges: &[Range<usize>]) -> Vec<f32> {
        ranges
            .iter()
            .flat_map(|range| self.flat[range.clone()].iter().copied())
            .collect()
    }

    /// Overwrites the summed gradients in `ranges` with `values` (as [`Stage::grads_in`]
    /// concatenates them).
    pub(crate) fn set_grads_in(&mut self, ranges: &[Range<usize>], values: &[f32]) {
        let mut next = 0;
        for range in ranges {
            let len = range.len();
            self.flat[range.clone()].copy_from_slice(&values[next..next + len]);
            next += len;
        }
    }

    /// Compares this stage's trainable parameters with its data-parallel copies'
    /// (`replicas`, one rank per copy) after step `step`, bit for bit: a fingerprint of them,
    /// in three exact 22-bit pieces, must have the same maximum and minimum over the copies.
    /// (Batch-norm running statistics are not compared: each copy's follow its own batches.)
    ///
    /// # Errors
    /// [`PipelineError::Diverged`] if they differ; [`PipelineError::PeerLost`] if a copy is
    /// gone.
    pub(crate) fn check_copies(
        &self,
        stage: usize,
        replicas: &CommWorker,
        step: usize,
    ) -> Result<(), PipelineError> {
        let print = kiln_core::fingerprint_values(&read_params(&self.model, &self.layout));
        let pieces: Vec<f32> = (0..3)
            .map(|i| ((print >> (22 * i)) & 0x3f_ffff) as f32)
            .collect();
        let lost = |err: kiln_comm::CommError| PipelineError::PeerLost {
            stage,
            what: format!("its data-parallel copies' parameters ({err})"),
        };
        let highest = replicas
            .all_reduce_values(pieces.clone(), ReduceOp::Max)
            .map_err(lost)?;
        let lowest = replicas
            .all_reduce_values(pieces, ReduceOp::Min)
            .map_err(lost)?;
        if highest != lowest {
            return Err(PipelineError::Diverged { stage, step });
        }
        Ok(())
    }

    /// Sums the gradients of tied parameters shared across stages with the other stages'
    /// over `pipeline` (after the data-parallel copies' reduction, before the update); no-op
    /// without such a tie.
    ///
    /// # Errors
    /// [`PipelineError::PeerLost`] if a stage is gone.
    pub(crate) fn sum_tied(
        &mut self,
        stage: usize,
        pipeline: Option<&Communicator>,
    ) -> Result<(), PipelineError> {
        let Some(tied) = &self.tied else {
            return Ok(());
        };
        let pipeline = pipeline.expect("a pipeline whose stages share a tie has their group");
        tied.sum(stage, &mut self.flat, pipeline)
    }

    /// Compares the stages' copies of tied parameters after step `step`, bit for bit; no-op
    /// without a tie across stages.
    ///
    /// # Errors
    /// [`PipelineError::TiedDiverged`] if they differ; [`PipelineError::PeerLost`] if a
    /// stage is gone.
    pub(crate) fn check_tied(
        &self,
        stage: usize,
        pipeline: Option<&Communicator>,
        step: usize,
    ) -> Result<(), PipelineError> {
        let Some(tied) = &self.tied else {
            return Ok(());
        };
        let pipeline = pipeline.expect("a pipeline whose stages share a tie has their group");
        tied.check(
            stage,
            &read_params(&self.model, &self.layout),
            pipeline,
            step,
        )
    }

    /// Finishes the summed gradients with `rule` (divided by `samples`; with clipping, the
    /// norm agreed with the other stages of the pipeline through `pipeline`), lets
    /// `optimizer` update the stage's parameters at `lr`, and clears the sums.
    ///
    /// # Errors
    /// [`PipelineError::PeerLost`] if the agreement with the other stages fails.
    pub(crate) fn step(
        mut self,
        stage: usize,
        rule: &mut MeanGradient,
        pipeline: Option<&Communicator>,
        optimizer: &mut ModuleOptimizer,
        lr: f64,
        samples: usize,
    ) -> Result<Self, PipelineError> {
        let copies = self.tied.as_ref().map_or(&[][..], TiedGradients::copies);
        let mut gradient = StageGradient {
            flat: &mut self.flat,
            copies,
        };
        let apply = rule
            .finish(&mut gradient, samples as f32, |summary| {
                agree_over_stages(summary, pipeline)
            })
            .map_err(|err| PipelineError::PeerLost {
                stage,
                what: format!("the other stages' gradient norms ({err})"),
            })?;
        if apply {
            let grads: GradientsParams = grads_from_flat(&self.model, &self.layout, &self.flat);
            self.model = optimizer.step(lr, self.model, grads);
        }
        self.flat.iter_mut().for_each(|g| *g = 0.0);
        Ok(self)
    }
}
