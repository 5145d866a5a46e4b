//! One micro-batch's forward and backward, reporting gradients group by group.
//!
//! A pass adds each group's gradients (scaled by the micro-batch size) to the replica's
//! [`GradStore`] and then calls `on_group`, which starts the all-reduce of every bucket that has
//! just become complete. [`segmented_pass`] cuts the graph at every segment boundary and runs
//! backward one segment at a time, so buckets of later segments are reduced while earlier
//! segments are still differentiating; [`full_pass`] is the fallback for models without
//! segments (one group, sync after backward).

use burn::tensor::Tensor;
use kiln_core::{Activation, FlatLayout, ImageClassifier, ParamInfo, SegmentId, Segmented};
use kiln_core::{param_infos, segment_param_infos};
use kiln_data::ImageBatch;
use kiln_train::{classification_loss, count_correct, forward_backward};

use crate::grads::GradStore;

/// Callback after a backward group: (group index in backward order, the gradients so far).
pub(crate) type OnGroup<'a> = &'a mut dyn FnMut(usize, &GradStore);

/// A pass over one micro-batch; returns (loss, correct predictions).
pub(crate) type Pass<M> =
    fn(&M, ImageBatch, &FlatLayout, &mut GradStore, f32, OnGroup<'_>) -> (f32, usize);

/// A pass with synchronised batch norm (see `synced_pass`), summing statistics over
/// replicas through the reducer.
pub(crate) type SyncedPass<M> = fn(
    &M,
    ImageBatch,
    &FlatLayout,
    &mut GradStore,
    f32,
    OnGroup<'_>,
    kiln_core::StatsReducer,
) -> (f32, usize);

/// A model's trainable parameters grouped in backward order, for a [`Pass`].
pub(crate) type Groups<M> = fn(&M) -> Vec<Vec<ParamInfo>>;

/// How a step runs forward and backward for one model type.
pub(crate) struct Passes<M> {
    /// The plain pass.
    pub plain: Pass<M>,
    /// The same cut for synchronised batch norm.
    pub synced: SyncedPass<M>,
    /// The parameter groups both report, in backward order.
    pub groups: Groups<M>,
}

fn trainable(infos: Vec<ParamInfo>) -> Vec<ParamInfo> {
    infos.into_iter().filter(|p| p.trainable).collect()
}

/// One group holding every trainable parameter.
pub(crate) fn whole_model_groups<M: ImageClassifier>(model: &M) -> Vec<Vec<ParamInfo>> {
    vec![trainable(param_infos(model))]
}

/// Forward and backward through the whole model, then one group.
pub(crate) fn full_pass<M: ImageClassifier>(
    model: &M,
    batch: ImageBatch,
    layout: &FlatLayout,
    store: &mut GradStore,
    scale: f32,
    on_group: OnGroup<'_>,
) -> (f32, usize) {
    let (mut grads, loss, correct) = forward_backward(model, batch);
    model.visit(&mut store.collector(&mut grads, layout, scale));
    on_group(0, store);
    (loss, correct)
}

/// The segments in backward order: output, last middle … first middle, input.
fn backward_order<M: Segmented>(model: &M) -> Vec<SegmentId> {
    model.segments().into_iter().rev().collect()
}

/// One group per segment, in backward order.
pub(crate) fn segment_groups<M: Segmented>(model: &M) -> Vec<Vec<ParamInfo>> {
    backward_order(model)
        .into_iter()
        .map(|segment| trainable(segment_param_infos(model, segment)))
        .collect()
}

/// Forward with a cut at every segment boundary, then backward segment by segment.
///
/// # Panics
/// If a segment's output does not depend on its input (no gradient reaches the boundary).
pub(crate) fn segmented_pass<M>(
    model: &M,
    batch: ImageBatch,
    layout: &FlatLayout,
    store: &mut GradStore,
    scale: f32,
    on_group: OnGroup<'_>,
) -> (f32, usize)
where
    M: ImageClassifier + Segmented<Input = Tensor<4>, Output = Tensor<2>>,
{
    // In-process replicas run this concurrently. (Wrong gradients once seen with concurrent
    // passes came from Burn's lazy parameter initialisation, fixed by `init_module`; the
    // equivalence tests and CI's MPI-versus-threads fingerprint check concurrent passes.)
    let middle = model.num_middle_segments();
    let mut outputs = Vec::with_capacity(middle + 1);
    let mut cuts = Vec::with_capacity(middle);
    let mut hidden = model.forward_input(batch.images);
    outputs.push(hidden.clone());
    for index in 0..middle {
        let cut = hidden.detach_boundary();
        hidden = model.forward_middle(index, cut.clone());
        cuts.push(cut);
        outputs.push(hidden.clone());
    }
    let last = hidden.detach_boundary();
    let logits = model.forward_output(last.clone());
    let loss = classification_loss(logits.clone(), batch.labels.clone());
    let loss_value = loss.clone().into_scalar::<f32>();
    let correct = count_correct(logits.detach(), batch.labels);

    let no_gradient = "a segment's output does not depend on its input";
    let mut grads = loss.backward();
    let mut upstream = last.boundary_grad(&grads).expect(no_gradient);
    model.visit_segment(
        SegmentId::Output,
        &mut store.collector(&mut grads, layout, scale),
    );
    drop(grads);
    on_group(0, store);
    for index in (0..middle).rev() {
        let mut grads = outputs[index + 1].backward_with(upstream);
        upstream = cuts[index].boundary_grad(&grads).expect(no_gradient);
        model.visit_segment(
            SegmentId::Middle(index),
            &mut store.collector(&mut grads, layout, scale),
        );
        drop(grads);
        on_group(middle - index, store);
    }
    let mut grads = outputs[0].backward_with(upstream);
    model.visit_segment(
        SegmentId::Input,
        &mut store.collector(&mut grads, layout, scale),
    );
    on_group(middle + 1, store);
    (loss_value, correct)
}
