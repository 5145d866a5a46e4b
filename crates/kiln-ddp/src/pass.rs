//! One micro-batch's forward and backward, reporting gradients group by group.
//!
//! A [`Pass`] runs forward on the step's working copy of the model (in the step's precision:
//! inputs cast, the output and the objective's loss in f32, the loss scaled for backward), adds each group's
//! gradients (weighted by [`MixedPrecision::gradient_weight`]) to the replica's
//! [`GradStore`] and then tells the [`GroupSink`], which starts the all-reduce of every
//! bucket that has just become complete. [`BySegment`] cuts the graph at every segment
//! boundary and runs backward one segment at a time, so buckets of later segments are
//! reduced while earlier segments are still differentiating; [`WholeModel`] is the fallback
//! for models without segments (one group, sync after backward).
//!
//! **Synchronised batch norm.** Given a reducer, forward runs under a [`StatsTape`], so every
//! [`kiln_core::sync_batch_norm`] layer normalises with statistics over all replicas and cuts
//! the graph at its input. Backward then runs each segment in pieces: first from the
//! segment's output down to its last synchronised layer, then, for each synchronised layer
//! from the last, its statistics' gradients are all-reduced ([`StatsTape::complete`]) and its
//! input gradient is sent on down to the layer before. A piece's gradient comes only from
//! pieces after it, so every gradient is complete when used. Without a reducer there are no
//! such layers and a segment is one piece.
//!
//! Burn consumes every node a backward visits, and the pieces of a residual segment share
//! its input (the skip path and the first convolution both read it), so a piece whose graph
//! was already consumed runs on a replay of the segment's forward with the recorded
//! statistics ([`StatsTape::replay`]). Without more knowledge every piece but the first gets
//! a replay; a model whose segments fork only at their input
//! ([`Segmented::only_input_forks`], kiln's ResNet) keeps using a graph until a piece
//! reaches the segment input. A segment's parameters are complete once its pieces are done.

use std::ops::{Add, Range};

use burn::module::Module;
use burn::tensor::{Gradients, Tensor};
use kiln_amp::MixedPrecision;
use kiln_core::{
    Activation, FlatLayout, Forward, ParamInfo, SegmentId, Segmented, StatsReducer, StatsTape,
    param_infos, segment_param_infos,
};
use kiln_data::Batch;
use kiln_train::{Objective, objective_loss};

use crate::grads::{Collector, GradStore};

/// Told when a backward group's gradients are all in the store (the bucketing).
pub(crate) trait GroupSink {
    /// Group `group` (index in backward order) is complete in `store`.
    fn group_done(&mut self, group: usize, store: &GradStore);
}

/// What a pass over one micro-batch works with.
pub(crate) struct PassContext<'a> {
    /// Where each parameter's gradient goes.
    pub layout: &'a FlatLayout,
    /// The replica's gradients.
    pub store: &'a mut GradStore,
    /// The step's precision.
    pub precision: &'a MixedPrecision,
    /// Told after each backward group.
    pub sink: &'a mut dyn GroupSink,
    /// With a reducer, layers normalised by `kiln_core::sync_batch_norm` are synchronised
    /// over replicas.
    pub reduce: Option<StatsReducer>,
}

/// How a step runs forward and backward of one micro-batch for one model type and
/// objective.
pub(crate) trait Pass<M, O: Objective> {
    /// The model's trainable parameters grouped as the pass reports them, in backward order.
    fn groups(&self, model: &M) -> Vec<Vec<ParamInfo>>;

    /// Forward and backward of `objective` on `batch` on `model` (the step's working copy);
    /// returns (loss, the objective's correct count).
    fn run(
        &self,
        model: &M,
        objective: &O,
        batch: O::Batch,
        context: PassContext<'_>,
    ) -> (f32, usize);
}

/// Forward and backward through the whole model, then one group (any model).
pub(crate) struct WholeModel;

/// Forward with a cut at every segment boundary, backward segment by segment.
pub(crate) struct BySegment;

impl<M, O> Pass<M, O> for WholeModel
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
{
    fn groups(&self, model: &M) -> Vec<Vec<ParamInfo>> {
        vec![trainable(param_infos(model))]
    }

    fn run(
        &self,
        model: &M,
        objective: &O,
        batch: O::Batch,
        context: PassContext<'_>,
    ) -> (f32, usize) {
        full_pass(model, objective, batch, context)
    }
}

impl<M, O> Pass<M, O> for BySegment
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output>,
    M::Hidden: Add<Output = M::Hidden>,
{
    fn groups(&self, model: &M) -> Vec<Vec<ParamInfo>> {
        backward_order(model)
            .into_iter()
            .map(|segment| trainable(segment_param_infos(model, segment)))
            .collect()
    }

    fn run(
        &self,
        model: &M,
        objective: &O,
        batch: O::Batch,
        context: PassContext<'_>,
    ) -> (f32, usize) {
        segmented_pass(model, objective, batch, context)
    }
}

fn trainable(infos: Vec<ParamInfo>) -> Vec<ParamInfo> {
    infos.into_iter().filter(|p| p.trainable).collect()
}

/// The segments in backward order: output, last middle … first middle, input.
fn backward_order<M: Segmented>(model: &M) -> Vec<SegmentId> {
    model.segments().into_iter().rev().collect()
}

/// Runs `forward`, recording synchronised layers when there is a reducer.
fn record<R>(reduce: Option<StatsReducer>, forward: impl FnOnce() -> R) -> (R, StatsTape) {
    match reduce {
        Some(reduce) => StatsTape::record(reduce, forward),
        None => (forward(), StatsTape::default()),
    }
}

/// Where each backward piece's parameter gradients go.
struct Sink<'a, M> {
    model: &'a M,
    layout: &'a FlatLayout,
    store: &'a mut GradStore,
    scale: f32,
}

impl<M: Module> Sink<'_, M> {
    /// Adds a backward piece's gradients of the parameters `visit` reaches to the store.
    fn collect(&mut self, grads: &mut Gradients, visit: &dyn Fn(&M, &mut Collector<'_>)) {
        visit(
            self.model,
            &mut self.store.collector(grads, self.layout, self.scale),
        );
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
struct Pieces<'a, M, H> {
    /// Visits the parameters the pieces can reach (the segment's).
    visit: &'a dyn Fn(&M, &mut Collector<'_>),
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
fn synchronised_pieces<M: Module, H: Activation + Add<Output = H>>(
    sink: &mut Sink<'_, M>,
    tape: &mut StatsTape,
    range: Range<usize>,
    pieces: Pieces<'_, M, H>,
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
        sink.collect(&mut grads, pieces.visit);
    }
}

/// Forward and backward through the whole model, then one group. Synchronised layers cost
/// a replay of the whole forward each (the model is one segment that forks inside).
fn full_pass<M, O>(
    model: &M,
    objective: &O,
    batch: O::Batch,
    context: PassContext<'_>,
) -> (f32, usize)
where
    O: Objective,
    M: Forward<Input = O::Input, Output = O::Output>,
{
    let PassContext {
        layout,
        store,
        precision,
        sink: group_sink,
        reduce,
    } = context;
    let samples = batch.samples();
    let input = precision.input(objective.input(&batch));
    let ((loss, output), mut tape) = record(reduce, || {
        let output = precision.logits(model.forward(input.clone()));
        (objective_loss(objective, &output, &batch), output)
    });
    let loss_value = loss.clone().into_scalar::<f32>();
    let correct = objective.correct(&output, &batch);
    let mut sink = Sink {
        model,
        layout,
        store,
        scale: precision.gradient_weight(samples),
    };
    let visit = |model: &M, collector: &mut Collector<'_>| model.visit(collector);
    let mut grads = precision.scaled_loss(loss).backward();
    let all = 0..tape.len();
    tape.harvest(&grads, all.clone());
    sink.collect(&mut grads, &visit);
    drop(grads);
    let replay = || {
        model.forward(input.clone());
        // The whole model has no boundary: no input leaf (any activation type will do).
        None::<Tensor<1>>
    };
    let pieces = Pieces {
        visit: &visit,
        input: None,
        reuse: false,
        recorded_usable: false,
    };
    synchronised_pieces(&mut sink, &mut tape, all, pieces, replay, &mut None);
    group_sink.group_done(0, sink.store);
    (loss_value, correct)
}

/// Forward with a cut at every segment boundary, then backward segment by segment, each in
/// pieces between its synchronised layers.
///
/// # Panics
/// If a segment's output does not depend on its input (no gradient reaches the boundary).
fn segmented_pass<M, O>(
    model: &M,
    objective: &O,
    batch: O::Batch,
    context: PassContext<'_>,
) -> (f32, usize)
where
    O: Objective,
    M: Segmented<Input = O::Input, Output = O::Output>,
    M::Hidden: Add<Output = M::Hidden>,
{
    // In-process replicas run this concurrently. (Wrong gradients once seen with concurrent
    // passes came from models initialised outside `init_module`, which draw from Burn's
    // process-wide generator; the equivalence tests and CI's MPI-versus-threads fingerprint
    // check concurrent passes.)
    let PassContext {
        layout,
        store,
        precision,
        sink: group_sink,
        reduce,
    } = context;
    let middle = model.num_middle_segments();
    let samples = batch.samples();
    let model_input = precision.input(objective.input(&batch));
    // Boundary k feeds middle segment k (k < middle) or the output segment (k = middle):
    // the value before the cut, the cut, and how many synchronised layers ran before it.
    let ((loss, output, boundaries), mut tape) = record(reduce, || {
        let mut boundaries: Vec<(M::Hidden, M::Hidden, usize)> = Vec::with_capacity(middle + 1);
        let mut hidden = model.forward_input(model_input.clone());
        for index in 0..=middle {
            let cut = hidden.clone().detach_boundary();
            boundaries.push((hidden, cut.clone(), StatsTape::recorded()));
            hidden = if index < middle {
                model.forward_middle(index, cut)
            } else {
                cut
            };
        }
        let output = precision.logits(model.forward_output(hidden));
        let loss = objective_loss(objective, &output, &batch);
        (loss, output, boundaries)
    });
    let loss_value = loss.clone().into_scalar::<f32>();
    let correct = objective.correct(&output, &batch);

    let mut sink = Sink {
        model,
        layout,
        store,
        scale: precision.gradient_weight(samples),
    };
    let mut loss = Some(precision.scaled_loss(loss));
    let mut upstream: Vec<Option<M::Hidden>> = vec![None; boundaries.len()];
    let no_gradient = "a segment's output does not depend on its input";
    let tied = model.tied_segments();
    for (group, segment) in backward_order(model).into_iter().enumerate() {
        let (input, output) = segment_boundaries(segment, middle);
        let start = input.map_or(0, |b| boundaries[b].2);
        let end = output.map_or(tape.len(), |b| boundaries[b].2);
        // Every piece of this segment reaches only its parameters, and those it reads from
        // segments that own them (a tied head reads the input segment's embedding: its
        // share of that gradient is added now, the owner's when the owner's turn comes).
        let owners = owners_read_by(&tied, segment);
        let visit = |model: &M, collector: &mut Collector<'_>| {
            model.visit_segment(segment, collector);
            for owner in &owners {
                model.visit_segment(*owner, collector);
            }
        };
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
        sink.collect(&mut grads, &visit);
        drop(grads);
        let replay = || replay_segment(model, segment, &boundaries, &model_input);
        let pieces = Pieces {
            visit: &visit,
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
        group_sink.group_done(group, sink.store);
    }
    (loss_value, correct)
}

/// The boundary feeding `segment` and the one its output crosses (boundary k feeds middle
/// segment k, boundary `middle` the output segment).
fn segment_boundaries(segment: SegmentId, middle: usize) -> (Option<usize>, Option<usize>) {
    match segment {
        SegmentId::Output => (Some(middle), None),
        SegmentId::Middle(k) => (Some(k), Some(k + 1)),
        SegmentId::Input => (None, Some(0)),
    }
}

/// The segments owning parameters that `reader` reads too (tied weights).
fn owners_read_by(tied: &[(SegmentId, SegmentId)], reader: SegmentId) -> Vec<SegmentId> {
    tied.iter()
        .filter(|(_, segment)| *segment == reader)
        .map(|(owner, _)| *owner)
        .collect()
}

/// `segment`'s forward again, from a fresh cut of its recorded input boundary (the last
/// boundary feeds the output segment): the graph a piece of its backward runs on. Returns
/// the fresh input, whose gradient flows on to the segment before.
fn replay_segment<M: Segmented>(
    model: &M,
    segment: SegmentId,
    boundaries: &[(M::Hidden, M::Hidden, usize)],
    model_input: &M::Input,
) -> Option<M::Hidden>
where
    M::Input: Clone,
{
    match segment {
        SegmentId::Input => {
            model.forward_input(model_input.clone());
            None
        }
        SegmentId::Middle(k) => {
            let fresh = boundaries[k].1.clone().detach_boundary();
            model.forward_middle(k, fresh.clone());
            Some(fresh)
        }
        SegmentId::Output => {
            let fresh = boundaries[boundaries.len() - 1].1.clone().detach_boundary();
            model.forward_output(fresh.clone());
            Some(fresh)
        }
    }
}
