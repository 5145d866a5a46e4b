//! Parameters that segments on different stages share (`Segmented::tied_segments`), such as
//! a GPT's output head reading the input segment's token embedding. As Megatron-LM does it:
//! the reader's stage holds a copy of the owner segment's parameters, each stage uses its
//! own, and every step the stages sum their gradients of them (after the data-parallel
//! copies' reduction, before clipping and the update), so both copies take the same update
//! and stay equal. The owner's stage counts them in the gradient's norm and saves them in
//! checkpoints; the copy is neither counted nor saved.

use std::collections::{BTreeSet, HashSet};
use std::ops::Range;

use burn::module::ParamId;
use kiln_comm::{Communicator, ReduceOp};
use kiln_core::{FlatLayout, SegmentId, Segmented, param_infos, segment_param_infos};

use crate::runtime::PipelineError;

/// Where the tied pairs of segments sit relative to one stage.
#[derive(Debug, Clone, Default)]
pub(crate) struct StageTies {
    /// Pairs `(owner, reader)` whose reader this stage runs: the reader's backward collects
    /// its share of the owner's parameters' gradient.
    pub reads: Vec<(SegmentId, SegmentId)>,
    /// Owner segments this stage holds a copy of (their own stage is another).
    pub copies: Vec<SegmentId>,
    /// Owner segments with a reader on another stage, in forward order: the stages sum
    /// the gradients of these segments' trainable parameters (every stage of the pipeline
    /// takes part, those without them adding nothing).
    pub shared: Vec<SegmentId>,
    /// The tests' control: the stages skip the sum (and still compare the copies).
    #[cfg(test)]
    pub sum_off: bool,
}

impl StageTies {
    /// Whether the stages sum any gradient between them.
    pub(crate) fn split(&self) -> bool {
        !self.shared.is_empty()
    }
}

/// The ties of `model` as stage `stage` of a split into `ranges` (per stage, the segment
/// indices of its chunks) sees them.
pub(crate) fn stage_ties<M: Segmented>(
    model: &M,
    ranges: &[Vec<Range<usize>>],
    stage: usize,
) -> StageTies {
    let segments = model.segments();
    let stage_of = |id: SegmentId| {
        let index = segments.iter().position(|s| *s == id)?;
        ranges
            .iter()
            .position(|chunks| chunks.iter().any(|chunk| chunk.contains(&index)))
    };
    let order = |id: &SegmentId| segments.iter().position(|s| s == id);
    let mut ties = StageTies::default();
    let mut shared = BTreeSet::new();
    for (owner, reader) in model.tied_segments() {
        let (Some(owner_stage), Some(reader_stage)) = (stage_of(owner), stage_of(reader)) else {
            continue; // not a segment of this model: nothing to share
        };
        if reader_stage == stage {
            ties.reads.push((owner, reader));
            if owner_stage != stage && !ties.copies.contains(&owner) {
                ties.copies.push(owner);
            }
        }
        if owner_stage != reader_stage {
            shared.insert((order(&owner), owner));
        }
    }
    ties.shared = shared.into_iter().map(|(_, owner)| owner).collect();
    ties
}

/// The ids of the trainable parameters and buffers of `segments`.
pub(crate) fn segment_ids<M: Segmented>(model: &M, segments: &[SegmentId]) -> HashSet<ParamId> {
    segments
        .iter()
        .flat_map(|segment| segment_param_infos(model, *segment))
        .map(|info| info.id)
        .collect()
}

/// What a stage does with the tied parameters' gradients and values.
#[derive(Debug, Clone)]
pub(crate) struct TiedGradients {
    /// Per shared trainable parameter, in an order every stage agrees on: its length and
    /// where this stage's gradient buffer holds it (`None`: this stage has no copy).
    pieces: Vec<(usize, Option<usize>)>,
    /// The ranges of the gradient buffer that hold copies (another stage counts them).
    copies: Vec<Range<usize>>,
    #[cfg(test)]
    sum_off: bool,
}

impl TiedGradients {
    /// The shared parameters of `ties` (on the whole `model`, before the stage empties the
    /// others) against the stage's buffer `layout`; `None` unless a tie spans stages.
    pub(crate) fn new<M: Segmented>(
        model: &M,
        ties: &StageTies,
        layout: &FlatLayout,
    ) -> Option<Self> {
        if !ties.split() {
            return None;
        }
        let shared = segment_ids(model, &ties.shared);
        let copied = segment_ids(model, &ties.copies);
        let mut pieces = Vec::new();
        let mut copies: Vec<Range<usize>> = Vec::new();
        // Whole-model order: the same on every stage, which built the same model.
        for info in param_infos(model) {
            if !info.trainable || !shared.contains(&info.id) {
                continue;
            }
            let offset = layout.get(info.id).map(|entry| entry.offset);
            if let (Some(offset), true) = (offset, copied.contains(&info.id)) {
                let range = offset..offset + info.numel();
                match copies.last_mut() {
                    Some(last) if last.end == range.start => last.end = range.end,
                    _ => copies.push(range),
                }
            }
            pieces.push((info.numel(), offset));
        }
        Some(Self {
            pieces,
            copies,
            #[cfg(test)]
            sum_off: ties.sum_off,
        })
    }

    /// The ranges of the gradient buffer whose values another stage counts.
    pub(crate) fn copies(&self) -> &[Range<usize>] {
        &self.copies
    }

    /// Sums the shared parameters' gradients in `flat` with the other stages' over
    /// `pipeline` (every stage of the pipeline calls this at the same point of its step).
    ///
    /// # Errors
    /// [`PipelineError::PeerLost`] if a stage is gone.
    pub(crate) fn sum(
        &self,
        stage: usize,
        flat: &mut [f32],
        pipeline: &Communicator,
    ) -> Result<(), PipelineError> {
        #[cfg(test)]
        if self.sum_off {
            return Ok(());
        }
        let total = self.pieces.iter().map(|(len, _)| len).sum();
        let mut values = vec![0.0f32; total];
        let mut next = 0;
        for &(len, offset) in &self.pieces {
            if let Some(offset) = offset {
                values[next..next + len].copy_from_slice(&flat[offset..offset + len]);
            }
            next += len;
        }
        pipeline
            .all_reduce(&mut values, ReduceOp::Sum)
            .map_err(|err| PipelineError::PeerLost {
                stage,
                what: format!("the other stages' gradients of a tied parameter ({err})"),
            })?;
        let mut next = 0;
        for &(len, offset) in &self.pieces {
            if let Some(offset) = offset {
                flat[offset..offset + len].copy_from_slice(&values[next..next + len]);
            }
            next += len;
        }
        Ok(())
    }

    /// Compares the stages' copies of the shared parameters (`params`: the stage's
    /// trainable values in its buffer's layout) after step `step`, bit for bit: a
    /// fingerprint of each stage's, in three exact 22-bit pieces, must have the same maximum
    /// and minimum over the stages that hold them.
    ///
    /// # Errors
    /// [`PipelineError::TiedDiverged`] if they differ; [`PipelineError::PeerLost`] if a
    /// stage is gone.
    pub(crate) fn check(
        &self,
        stage: usize,
        params: &[f32],
        pipeline: &Communicator,
        step: usize,
    ) -> Result<(), PipelineError> {
        let held: Vec<f32> = self
            .pieces
            .iter()
            .filter_map(|&(len, offset)| offset.map(|o| &params[o..o + len]))
            .flatten()
            .copied()
            .collect();
        let holds = self.pieces.iter().any(|(_, offset)| offset.is_some());
        let print = kiln_core::fingerprint_values(&held);
        let pieces = |absent: f32| -> Vec<f32> {
            (0..3)
                .map(|i| {
                    if holds {
                        ((print >> (22 * i)) & 0x3f_ffff) as f32
                    } else {
                        absent // a stage without a copy leaves the extremes to the others
                    }
                })
                .collect()
        };
        let lost = |err: kiln_comm::CommError| PipelineError::PeerLost {
            stage,
            what: format!("the other stages' copies of a tied parameter ({err})"),
        };
        let (mut highest, mut lowest) = (pieces(f32::NEG_INFINITY), pieces(f32::INFINITY));
        pipeline
            .all_reduce(&mut highest, ReduceOp::Max)
            .map_err(lost)?;
        pipeline
            .all_reduce(&mut lowest, ReduceOp::Min)
            .map_err(lost)?;
        if highest != lowest {
            return Err(PipelineError::TiedDiverged { step });
        }
        Ok(())
    }
}
