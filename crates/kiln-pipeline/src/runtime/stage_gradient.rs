//! A stage's gradient buffer: the ranges each chunk's gradients fill (for the data-parallel
//! copies' reduction chunk by chunk), and what the mean-gradient rule counts in the norm (not
//! the copies of tied parameters another stage owns).

use std::ops::Range;

use kiln_comm::Communicator;
use kiln_core::{FlatLayout, SegmentId, Segmented, segment_param_infos};
use kiln_train::{GradientSummary, GradientValues, TrainError};

/// A stage's gradient buffer as the mean-gradient rule sees it: every value is scaled, but
/// the copies of tied parameters another stage owns are left out of the summary (the
/// owner's stage counts them, once).
pub(crate) struct StageGradient<'a> {
    pub(crate) flat: &'a mut [f32],
    pub(crate) copies: &'a [Range<usize>],
}

impl GradientValues for StageGradient<'_> {
    fn scale(&mut self, factor: f32) {
        self.flat.scale(factor);
    }

    fn summary(&self) -> GradientSummary {
        let mut summary = GradientSummary::default();
        let mut next = 0;
        for copy in self.copies {
            summary = summary.combine(GradientSummary::of(&self.flat[next..copy.start]));
            next = copy.end;
        }
        summary.combine(GradientSummary::of(&self.flat[next..]))
    }
}

/// The summary of the whole model's gradient from each stage's (see
/// [`GradientSummary::sum_over_ranks`]).
pub(crate) fn agree_over_stages(
    summary: GradientSummary,
    pipeline: Option<&Communicator>,
) -> Result<GradientSummary, TrainError> {
    let Some(pipeline) = pipeline else {
        return Ok(summary);
    };
    summary.sum_over_ranks(|mut values, op| {
        pipeline.all_reduce(&mut values, op)?;
        Ok(values)
    })
}

/// Per chunk, the ranges of `layout` its segments' parameters fill (adjacent ones merged);
/// `None` unless they are disjoint and cover the layout.
pub(crate) fn chunk_ranges<M: Segmented>(
    model: &M,
    (segments, reads): (&[SegmentId], &[(SegmentId, SegmentId)]),
    chunks: &[Range<usize>],
    layout: &FlatLayout,
) -> Option<Vec<Vec<Range<usize>>>> {
    let mut covered = vec![false; layout.len()];
    let mut all = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let mut ranges: Vec<Range<usize>> = Vec::new();
        // A chunk's gradients: its segments', and those of the tied parameters its readers
        // read (a parameter read in two chunks is in neither's alone).
        let visited = chunk.clone().flat_map(|index| {
            let segment = segments[index];
            std::iter::once(segment).chain(
                reads
                    .iter()
                    .filter(move |(_, reader)| *reader == segment)
                    .map(|(owner, _)| *owner),
            )
        });
        for segment in visited {
            for info in segment_param_infos(model, segment) {
                let Some(entry) = layout.get(info.id) else {
                    continue; // not trainable
                };
                let range = entry.offset..entry.offset + entry.info.numel();
                if covered[range.clone()].iter().any(|&c| c) {
                    return None; // a parameter of two chunks (or two segments)
                }
                covered[range.clone()].iter_mut().for_each(|c| *c = true);
                match ranges.last_mut() {
                    Some(last) if last.end == range.start => last.end = range.end,
                    _ => ranges.push(range),
                }
            }
        }
        all.push(ranges);
    }
    covered.iter().all(|&c| c).then_some(all)
}
