//! Passes with synchronised batch norm: backward piece by piece, in reverse.
//!
//! Forward runs under a [`StatsTape`], so every [`kiln_core::sync_batch_norm`] layer
//! normalises with statistics over all replicas and cuts the graph at its input. Backward
//! then runs segment by segment from the loss towards the input, and within a segment
//! piece by piece: first from the segment's output down to its last synchronised layer,
//! then, for each synchronised layer from the last, its statistics' gradients are
//! all-reduced ([`StatsTape::complete`]) and its input gradient is sent on down to the
//! layer before. A piece's gradient comes only from pieces after it, so every gradient is
//! complete when used.
//!
//! Burn consumes every node a backward visits, and the pieces of a residual segment share
//! its input (the skip path and the first convolution both read it), so a piece whose graph
//! was already consumed runs on a replay of the segment's forward with the recorded
//! statistics ([`StatsTape::replay`]). Without more knowledge every piece but the first gets
//! a replay; a model whose segments fork only at their input
//! ([`Segmented::only_input_forks`], kiln's ResNet) keeps using a graph until a piece
//! reaches the segment input. A segment's parameters are complete once its pieces are
//! done: its buckets start then, as in the plain pass.

use std::ops::{Add, Range};

use burn::tensor::{Gradients, Tensor};
use kiln_core::{
    Activation, FlatLayout, ImageClassifier, SegmentId, Segmented, StatsReducer, StatsTape,
};
use kiln_data::ImageBatch;
use kiln_train::{classification_loss, count_correct};

use crate::grads::GradStore;
use crate::pass::OnGroup;

/// Where each backward piece's parameter gradients go.
struct Sink<'a, M> {
    model: &'a M,
    layout: &'a FlatLayout,
    store: &'a mut GradStore,
    scale: f32,
}

impl<M: ImageClassifier> Sink<'_, M> {
    /// Adds a backward piece's parameter gradients to the store.
    fn collect(&mut self, grads: &mut Gradients) {
        let collector = &mut self.store.collector(grads, self.layout, self.scale);
        self.model.visit(collector);
    }
}

/// Adds `grad` (if any) to `slot`.
fn accumulate<H: Add<Output = H>>(slot: &mut Option<H>, grad: Option<H>) {
    if let Some(grad) = grad {
        *slot = Some(match slot.take() {
            Some(sum) => sum + grad,
            None => grad,
        });
    }
}

/// Where the pieces of a segment run.
struct Pieces<'a, H> {
    /// The recorded graph's input leaf of the segment (if the segment has one).
    input: Option<&'a H>,
    /// Whether pieces may share a graph until one reaches the segment input
    /// ([`Segmented::only_input_forks`]); without it, every piece gets a fresh replay.
    reuse: bool,
    /// Whether the recorded graph can still run a piece (its input not yet reached).
    recorded_usable: bool,
}

/// A graph a piece runs on: the recorded one, or a replay with its own input leaf.
enum Instance<H> {
    Recorded,
    Replay(StatsTape, Option<H>),
}

/// The pieces below a segment's first: for each synchronised layer of `range`, from the
/// last, complete its input gradient and backpropagate it, on the recorded graph while
/// that is safe, else on a replay of the segment (`replay` reruns the segment's forward and
/// returns the replay's input leaf, if the segment has one). Gradients reaching the
/// segment input go to `input_grad`.
fn synchronised_pieces<M: ImageClassifier, H: Activation + Add<Output = H>>(
    sink: &mut Sink<'_, M>,
    tape: &mut StatsTape,
    range: Range<usize>,
    pieces: Pieces<'_, H>,
    replay: impl Fn() -> Option<H>,
    input_grad: &mut Option<H>,
) {
    let mut current = (pieces.reuse && pieces.recorded_usable).then_some(Instance::Recorded);
    for index in range.clone().rev() {
        let upstream = tape.complete(index);
        let instance = current.get_or_insert_with(|| {
            let (input, replayed) = tape.replay(range.clone(), &replay);
            Instance::Replay(replayed, input)
        });
        let piece = index - range.start;
        let (mut grads, reached) = match instance {
            Instance::Recorded => {
                let grads = tape.backward_input(index, upstream);
                tape.harvest(&grads, range.start..index);
                let reached = pieces.input.and_then(|input| input.boundary_grad(&grads));
                (grads, reached)
            }
            Instance::Replay(replayed, input) => {
                let grads = replayed.backward_input(piece, upstream);
                tape.harvest_replay(range.start, replayed, &grads, piece);
                let reached = input.as_ref().and_then(|input| input.boundary_grad(&grads));
                (grads, reached)
            }
        };
        // Burn has consumed what this piece visited: the graph stays usable only if the
        // model promises that nothing but the segment input is shared, and the input was
        // not reached.
        if !pieces.reuse || reached.is_some() {
            current = None;
        }
        accumulate(input_grad, reached);
        sink.collect(&mut grads);
    }
}

/// The whole model as one segment (models without segments): one replay of the whole
/// forward per synchronised layer.
pub(crate) fn synced_full_pass<M: ImageClassifier>(
    model: &M,
    batch: ImageBatch,
    layout: &FlatLayout,
    store: &mut GradStore,
    scale: f32,
    on_group: OnGroup<'_>,
    reduce: StatsReducer,
) -> (f32, usize) {
    let images = batch.images.clone();
    let ((loss, logits), mut tape) = StatsTape::record(reduce, || {
        let logits = model.forward_logits(batch.images);
        (
            classification_loss(logits.clone(), batch.labels.clone()),
            logits,
        )
    });
    let loss_value = loss.clone().into_scalar::<f32>();
    let correct = count_correct(logits.detach(), batch.labels);
    let mut sink = Sink {
        model,
        layout,
        store,
        scale,
    };
    let mut grads = loss.backward();
    let all = 0..tape.len();
    tape.harvest(&grads, all.clone());
    sink.collect(&mut grads);
    drop(grads);
    let replay = || {
        model.forward_logits(images.clone());
        None::<Tensor<4>>
    };
    // The whole model as one segment forks inside (residual blocks): replay every piece.
    let pieces = Pieces {
        input: None,
        reuse: false,
        recorded_usable: false,
    };
    synchronised_pieces(&mut sink, &mut tape, all, pieces, replay, &mut None);
    on_group(0, sink.store);
    (loss_value, correct)
}

/// Segment by segment, each in pieces between its synchronised layers.
///
/// # Panics
/// If a segment's output does not depend on its input (no gradient reaches the boundary).
pub(crate) fn synced_segmented_pass<M>(
    model: &M,
    batch: ImageBatch,
    layout: &FlatLayout,
    store: &mut GradStore,
    scale: f32,
    on_group: OnGroup<'_>,
    reduce: StatsReducer,
) -> (f32, usize)
where
    M: ImageClassifier + Segmented<Input = Tensor<4>, Output = Tensor<2>>,
    M::Hidden: Add<Output = M::Hidden>,
{
    let middle = model.num_middle_segments();
    let images = batch.images.clone();
    // Boundary k feeds middle segment k (k < middle) or the output segment (k = middle):
    // the value before the cut, the cut, and how many synchronised layers ran before it.
    let ((loss, logits, boundaries), mut tape) = StatsTape::record(reduce, || {
        let mut boundaries: Vec<(M::Hidden, M::Hidden, usize)> = Vec::with_capacity(middle + 1);
        let mut hidden = model.forward_input(batch.images);
        for index in 0..=middle {
            let cut = hidden.clone().detach_boundary();
            boundaries.push((hidden, cut.clone(), StatsTape::recorded()));
            hidden = if index < middle {
                model.forward_middle(index, cut)
            } else {
                cut
            };
        }
        let logits = model.forward_output(hidden);
        let loss = classification_loss(logits.clone(), batch.labels.clone());
        (loss, logits, boundaries)
    });
    let loss_value = loss.clone().into_scalar::<f32>();
    let correct = count_correct(logits.detach(), batch.labels);

    let mut sink = Sink {
        model,
        layout,
        store,
        scale,
    };
    let mut upstream: Vec<Option<M::Hidden>> = vec![None; boundaries.len()];
    let no_gradient = "a segment's output does not depend on its input";
    let mut loss = Some(loss);
    // Backward order: output, middle segments from the last, input (= group index).
    let order = std::iter::once(SegmentId::Output)
        .chain((0..middle).rev().map(SegmentId::Middle))
        .chain(std::iter::once(SegmentId::Input));
    for (group, segment) in order.enumerate() {
        // The boundary feeding this segment, and the one its output crosses.
        let (input, output) = match segment {
            SegmentId::Output => (Some(middle), None),
            SegmentId::Middle(k) => (Some(k), Some(k + 1)),
            SegmentId::Input => (None, Some(0)),
        };
        let start = input.map_or(0, |b| boundaries[b].2);
        let end = output.map_or(tape.len(), |b| boundaries[b].2);
        // First piece: from the segment's output down to its last synchronised layer.
        let mut grads = match output {
            None => loss
                .take()
                .expect("the output segment comes first")
                .backward(),
            Some(b) => {
                let gradient = upstream[b].take().expect(no_gradient);
                boundaries[b].0.backward_with(gradient)
            }
        };
        tape.harvest(&grads, start..end);
        let reached = input.and_then(|b| boundaries[b].1.boundary_grad(&grads));
        let recorded_usable = reached.is_none();
        if let Some(b) = input {
            accumulate(&mut upstream[b], reached);
        }
        sink.collect(&mut grads);
        drop(grads);
        let replay = || match segment {
            SegmentId::Input => {
                model.forward_input(images.clone());
                None
            }
            SegmentId::Middle(k) => {
                let fresh = boundaries[k].1.clone().detach_boundary();
                model.forward_middle(k, fresh.clone());
                Some(fresh)
            }
            SegmentId::Output => {
                let fresh = boundaries[middle].1.clone().detach_boundary();
                model.forward_output(fresh.clone());
                Some(fresh)
            }
        };
        let pieces = Pieces {
            input: input.map(|b| &boundaries[b].1),
            reuse: model.only_input_forks(),
            recorded_usable,
        };
        let mut input_grad = None;
        synchronised_pieces(
            &mut sink,
            &mut tape,
            start..end,
            pieces,
            replay,
            &mut input_grad,
        );
        if let Some(b) = input {
            accumulate(&mut upstream[b], input_grad);
        }
        on_group(group, sink.store);
    }
    (loss_value, correct)
}
