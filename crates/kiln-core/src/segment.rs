//! Models as ordered lists of segments.
//!
//! Data-parallel training runs backward one segment at a time so that a segment's gradients
//! are all-reduced while earlier segments are still differentiating; the planner profiles
//! segments, and pipelines place contiguous runs of them on devices. All three need the same
//! view of a model, which [`Segmented`] gives:
//!
//! ```text
//!  Input ──▶ [input segment] ──Hidden──▶ [middle 0] ──Hidden──▶ … ──▶ [output segment] ──▶ Output
//! ```
//!
//! The middle segments share one activation type ([`Segmented::Hidden`]), so every boundary
//! can be cut with [`Activation::detach_boundary`] and any contiguous run of them can form a
//! pipeline stage. Running the segments in order must be exactly the
//! model's `forward` ([`forward_segments`]).

use burn::module::{Module, ModuleVisitor};
use burn::tensor::{Device, Gradients, Tensor, TensorData};

/// Names one segment of a [`Segmented`] model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentId {
    /// The first segment: takes the model input, produces the first hidden activation.
    Input,
    /// The `i`-th middle segment (0-based): hidden activation in, hidden activation out.
    Middle(usize),
    /// The last segment: takes the last hidden activation, produces the model output.
    Output,
}

/// A value that flows across a segment boundary and can be cut out of the autodiff graph.
pub trait Activation: Clone + Send + 'static {
    /// Cuts the graph here: the result is a leaf that records its own gradient.
    fn detach_boundary(self) -> Self;
    /// The gradient that reached this (boundary) value, if any.
    fn boundary_grad(&self, grads: &Gradients) -> Option<Self>;
    /// Backpropagates from this value with `upstream` as its incoming gradient.
    ///
    /// The gradients of everything upstream equal those of the uncut graph: backward of
    /// `sum(self * upstream)` seeds exactly `upstream` at `self`.
    fn backward_with(&self, upstream: Self) -> Gradients;
    /// Size in bytes (for memory profiling and pipeline transfers).
    fn size_bytes(&self) -> usize;
    /// Its tensors' values, for a pipeline stage in another process; `None` (the default)
    /// when the type cannot travel so (implement both halves to let it).
    fn to_host(&self) -> Option<Vec<TensorData>> {
        None
    }
    /// The value [`to_host`](Self::to_host) gave, rebuilt on `device` (outside any graph).
    fn from_host(parts: Vec<TensorData>, device: &Device) -> Option<Self> {
        let _ = (parts, device);
        None
    }
    /// The value on `device`'s compute resource, outside any graph, in its own dtype, and
    /// tracked by autodiff exactly when it was (as [`Tensor::to_device`]): how a pipeline
    /// stage's output reaches a stage on another device, and its gradient comes back.
    /// `None` (the default) when the type cannot move (implement it to let stages on
    /// different devices pass it).
    fn to_device(self, device: &Device) -> Option<Self> {
        let _ = device;
        None
    }
}

impl<const D: usize> Activation for Tensor<D> {
    fn detach_boundary(self) -> Self {
        self.detach().require_grad()
    }

    fn boundary_grad(&self, grads: &Gradients) -> Option<Self> {
        self.grad(grads)
    }

    fn backward_with(&self, upstream: Self) -> Gradients {
        crate::backward_from(self, upstream)
    }

    fn size_bytes(&self) -> usize {
        self.shape().num_elements() * self.dtype().size()
    }

    fn to_host(&self) -> Option<Vec<TensorData>> {
        Some(vec![self.clone().detach().into_data()])
    }

    fn from_host(parts: Vec<TensorData>, device: &Device) -> Option<Self> {
        let [data] = <[TensorData; 1]>::try_from(parts).ok()?;
        let dtype = data.dtype();
        (data.shape().len() == D).then(|| Tensor::from_data(data, (device, dtype)))
    }

    fn to_device(self, device: &Device) -> Option<Self> {
        // Detached first: moving a tensor in a graph would record the move in the sender's
        // graph, which the receiver cuts off anyway.
        Some(Tensor::to_device(self.detach(), device))
    }
}

/// A model that can run as an ordered list of segments.
///
/// Implement it for your own Burn model to get overlapped gradient sync, pipeline stages and
/// the planner. The contract: [`forward_segments`]
/// returns exactly what the model's own forward returns, and
/// [`visit_segment`](Self::visit_segment) over all segments visits every parameter exactly
/// once.
pub trait Segmented: Module {
    /// The model input (e.g. a batch of images).
    type Input;
    /// The activation passed between segments.
    type Hidden: Activation;
    /// The model output (e.g. logits).
    type Output;

    /// Number of middle segments.
    fn num_middle_segments(&self) -> usize;
    /// Runs the input segment.
    fn forward_input(&self, input: Self::Input) -> Self::Hidden;
    /// Runs middle segment `index`.
    ///
    /// # Panics
    /// If `index >= num_middle_segments()`.
    fn forward_middle(&self, index: usize, hidden: Self::Hidden) -> Self::Hidden;
    /// Runs the output segment.
    fn forward_output(&self, hidden: Self::Hidden) -> Self::Output;
    /// Visits the parameters owned by `segment`.
    fn visit_segment<V: ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V);

    /// Whether, inside every segment, the segment's input is the only value that more than
    /// one operation reads (true of residual blocks: the skip path and the first convolution
    /// read the block input, nothing else forks). With it, synchronised batch norm
    /// ([`crate::sync_norm`]) reuses a segment's graph for consecutive backward pieces until
    /// one reaches the segment input, replaying the segment's forward less often. Claiming
    /// it wrongly makes Burn refuse a backward (a panic), never a wrong gradient.
    fn only_input_forks(&self) -> bool {
        false
    }

    /// Segments that read a parameter another segment owns (visits), as `(owner, reader)`
    /// pairs: an output head tied to the input segment's embedding is `(Input, Output)`.
    /// The reader's backward collects its share of the owner's gradient. Data parallelism
    /// needs nothing more (the parameter is one tensor, its gradient one sum); a pipeline
    /// that puts such a pair on different stages gives the reader's stage a copy of the
    /// owner segment's parameters and sums the stages' gradients of them every step, so the
    /// copies stay equal. None by default.
    fn tied_segments(&self) -> Vec<(SegmentId, SegmentId)> {
        Vec::new()
    }

    /// Every segment in forward order.
    fn segments(&self) -> Vec<SegmentId> {
        let mut ids = Vec::with_capacity(self.num_middle_segments() + 2);
        ids.push(SegmentId::Input);
        ids.extend((0..self.num_middle_segments()).map(SegmentId::Middle));
        ids.push(SegmentId::Output);
        ids
    }
}

/// Runs every segment of `model` in order: the same result as the model's forward.
pub fn forward_segments<M: Segmented>(model: &M, input: M::Input) -> M::Output {
    let mut hidden = model.forward_input(input);
    for index in 0..model.num_middle_segments() {
        hidden = model.forward_middle(index, hidden);
    }
    model.forward_output(hidden)
}
