//! Synchronised batch normalisation: batch statistics over every replica's batch.
//!
//! With plain batch norm, each data-parallel replica normalises with the statistics of its
//! own shard, so N replicas of batch b do not train like one device with batch N·b (and
//! small per-device batches give noisy statistics). [`sync_batch_norm`] normalises with the
//! mean and variance of the union of all replicas' batches, and its backward is exact:
//! the gradient flowing into the statistics is summed over replicas, as if one device had
//! run the whole batch.
//!
//! Burn 0.22 has no hook to run a collective inside `backward()`, so kiln cuts the autodiff
//! graph at every synchronised layer instead: the layer computes its output from a detached
//! copy of its input and from the statistics as leaves. A [`StatsTape`] records those cuts
//! during forward; kiln's data-parallel pass then runs backward piece by piece, in reverse,
//! and at each cut all-reduces the statistics' gradients before sending the completed input
//! gradient upstream. Burn consumes every node a backward visits, and the pieces of a
//! residual block share its input (the skip path and the convolution both read it), so a
//! piece whose graph was consumed runs on a replay of its segment's forward
//! ([`StatsTape::replay`]: the recorded statistics, no collectives, no running-statistics
//! update). That costs up to one extra segment forward per synchronised layer (one per
//! residual block for models declaring `Segmented::only_input_forks`). Outside such a
//! pass (one device, evaluation, or a step without synchronised batch norm),
//! [`sync_batch_norm`] is exactly `bn.forward(x)`.
//!
//! Use it in a model's forward in place of `bn.forward(x)`; parameters and running
//! statistics stay in the `BatchNorm` (checkpoints are unchanged):
//!
//! ```
//! use burn::nn::{BatchNorm, BatchNormConfig};
//! use burn::tensor::{Device, Tensor};
//!
//! let device = Device::flex();
//! let bn: BatchNorm = BatchNormConfig::new(3).init(&device);
//! let x = Tensor::<4>::ones([2, 3, 4, 4], &device);
//! // No data-parallel pass is running: the same as `bn.forward(x)`.
//! let y = kiln_core::sync_batch_norm(&bn, x);
//! assert_eq!(y.dims(), [2, 3, 4, 4]);
//! ```

use std::cell::RefCell;
use std::ops::Range;

use burn::nn::BatchNorm;
use burn::tensor::{Device, FloatDType, Gradients, Tensor, TensorData};

/// Sums a vector over every replica (the same call, in the same order, on each); `None`
/// when communication failed (the caller keeps the error and fails the step).
pub type StatsReducer = Box<dyn FnMut(Vec<f32>) -> Option<Vec<f32>>>;

/// One synchronised normalisation, cut out of the autodiff graph.
struct StatsCut {
    /// The layer input as `[N, C, L]`, still in the graph.
    input: Tensor<3>,
    /// The detached copy the layer normalised.
    cut: Tensor<3>,
    /// The global mean and (biased) variance, as leaves.
    mean: Tensor<1>,
    var: Tensor<1>,
    /// Samples in this replica's batch.
    samples: usize,
    /// Elements per channel over every replica.
    elements: f32,
    /// Gradients that reached the cut so far.
    upstream_input: Option<Tensor<3>>,
    upstream_mean: Option<Tensor<1>>,
    upstream_var: Option<Tensor<1>>,
}

/// Where a synchronised layer takes its statistics from.
enum Mode {
    /// All-reduce them (the recorded forward).
    Record(StatsReducer),
    /// Reuse recorded ones, in order: (mean, variance, elements per channel).
    Replay {
        stats: Vec<(Tensor<1>, Tensor<1>, f32)>,
        next: usize,
    },
}

struct Scope {
    mode: Mode,
    cuts: Vec<StatsCut>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// Whether a data-parallel pass with synchronised batch norm is running on this thread.
pub fn sync_batch_norm_active() -> bool {
    SCOPE.with(|scope| scope.borrow().is_some())
}

/// Batch norm with statistics over every replica's batch during kiln's synchronised
/// data-parallel pass; `bn.forward(x)` anywhere else (see the [module docs](self)).
///
/// Computes in `f32` whatever the input's dtype (the output has the input's dtype).
///
/// # Panics
/// If `x` has fewer than two dimensions or its channel count differs from `bn`'s.
pub fn sync_batch_norm<const D: usize>(bn: &BatchNorm, x: Tensor<D>) -> Tensor<D> {
    let training = x.device().is_autodiff() && bn.training.is_enabled();
    if !(training && sync_batch_norm_active()) {
        return bn.forward(x);
    }
    let dims = x.dims();
    assert!(D >= 2, "batch norm needs [batch, channels, ..]");
    let [channels] = bn.gamma.dims();
    assert_eq!(
        dims[1], channels,
        "input channels differ from the batch norm's"
    );
    let (samples, length) = (dims[0], dims[2..].iter().product::<usize>());
    let dtype = x.dtype();

    let input = x.cast(FloatDType::F32).reshape([samples, channels, length]);
    let cut = input.clone().detach().require_grad();
    let values = input.clone().detach().inner();

    let (mean_t, var_t, elements) = match replayed_stats() {
        Some(stats) => stats,
        None => {
            let (mean, var, elements) = global_stats(values, samples * length);
            update_running_statistics(bn, mean.clone(), var.clone());
            (mean, var, elements)
        }
    };
    let mean_leaf = Tensor::from_inner(mean_t.clone()).require_grad();
    let var_leaf = Tensor::from_inner(var_t.clone()).require_grad();
    let gamma = bn
        .gamma
        .val()
        .cast(FloatDType::F32)
        .reshape([1, channels, 1]);
    let beta = bn
        .beta
        .val()
        .cast(FloatDType::F32)
        .reshape([1, channels, 1]);
    let std = (var_leaf.clone().reshape([1, channels, 1]) + bn.epsilon).sqrt();
    let output = (cut.clone() - mean_leaf.clone().reshape([1, channels, 1])) / std * gamma + beta;

    SCOPE.with(|scope| {
        if let Some(scope) = scope.borrow_mut().as_mut() {
            scope.cuts.push(StatsCut {
                input,
                cut,
                mean: mean_leaf,
                var: var_leaf,
                samples,
                elements,
                upstream_input: None,
                upstream_mean: None,
                upstream_var: None,
            });
        }
    });
    output.reshape(dims).cast(FloatDType::from(dtype))
}

/// Mean and (biased) variance per channel over every replica's batch, and the number of
/// elements per channel they cover: two reductions (sum, then centred squares), matching
/// Burn's centred variance rather than E[x²] − E[x]².
fn global_stats(values: Tensor<3>, local_elements: usize) -> (Tensor<1>, Tensor<1>, f32) {
    let [_, channels, _] = values.dims();
    let local = values.device();
    let mut sums = per_channel_sum(values.clone());
    sums.push(local_elements as f32);
    let totals = reduce(sums);
    let elements = totals[channels].max(1.0);
    let mean: Vec<f32> = totals[..channels].iter().map(|s| s / elements).collect();
    let mean = vector(mean, &local);
    let centred = values - mean.clone().reshape([1, channels, 1]);
    let squares = reduce(per_channel_sum(centred.clone() * centred));
    let var: Vec<f32> = squares.iter().map(|s| s / elements).collect();
    (mean, vector(var, &local), elements)
}

/// The next recorded statistics, when replaying.
fn replayed_stats() -> Option<(Tensor<1>, Tensor<1>, f32)> {
    SCOPE.with(
        |scope| match scope.borrow_mut().as_mut().map(|s| &mut s.mode) {
            Some(Mode::Replay { stats, next }) => {
                let stats = stats
                    .get(*next)
                    .cloned()
                    .expect("a replay runs the layers it recorded");
                *next += 1;
                Some(stats)
            }
            _ => None,
        },
    )
}

/// Momentum update of `bn`'s running statistics with a batch's `mean` and (biased) `var`,
/// kept in the statistics' own dtype and device, as Burn's batch norm does in training.
pub fn update_running_statistics(bn: &BatchNorm, mean: Tensor<1>, var: Tensor<1>) {
    let m = bn.momentum;
    let blend = |running: Tensor<1>, batch: Tensor<1>| {
        let batch = batch
            .to_device(&running.device())
            .cast(FloatDType::from(running.dtype()));
        (running.mul_scalar(1.0 - m) + batch.mul_scalar(m)).detach()
    };
    bn.running_mean
        .update(blend(bn.running_mean.value_sync(), mean));
    bn.running_var
        .update(blend(bn.running_var.value_sync(), var));
}

/// Per-channel sums of a `[N, C, L]` tensor, on the host.
fn per_channel_sum(values: Tensor<3>) -> Vec<f32> {
    let [_, channels, _] = values.dims();
    values
        .sum_dim(2)
        .sum_dim(0)
        .reshape([channels])
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("converted to f32")
}

fn vector(values: Vec<f32>, device: &Device) -> Tensor<1> {
    let len = values.len();
    Tensor::from_data(TensorData::new(values, [len]), device)
}

/// Sums `values` over replicas through the current scope (locally if it has failed).
fn reduce(values: Vec<f32>) -> Vec<f32> {
    SCOPE.with(
        |scope| match scope.borrow_mut().as_mut().map(|s| &mut s.mode) {
            Some(Mode::Record(reduce)) => reduce(values.clone()).unwrap_or(values),
            _ => values,
        },
    )
}

/// The synchronised normalisations of one forward pass, for a backward run cut by cut.
///
/// Made by [`StatsTape::record`] (or [`StatsTape::replay`]); kiln-ddp's synchronised pass
/// drives it. Every replica must run the same forward (same layers, same order), since each
/// layer's statistics are one collective.
pub struct StatsTape {
    cuts: Vec<StatsCut>,
    /// The reducer of a recorded tape (`None` for a replay).
    reduce: Option<StatsReducer>,
}

/// An empty tape: no synchronised layer ran (a pass without synchronisation).
impl Default for StatsTape {
    fn default() -> Self {
        Self {
            cuts: Vec::new(),
            reduce: None,
        }
    }
}

impl std::fmt::Debug for StatsTape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsTape")
            .field("cuts", &self.cuts.len())
            .field("recorded", &self.reduce.is_some())
            .finish()
    }
}

/// Runs `forward` with `mode` installed on this thread; returns its result and the cuts.
fn scoped<R>(mode: Mode, forward: impl FnOnce() -> R) -> (R, Scope) {
    SCOPE.with(|scope| {
        let mut scope = scope.borrow_mut();
        assert!(
            scope.is_none(),
            "synchronised batch-norm scopes do not nest"
        );
        *scope = Some(Scope {
            mode,
            cuts: Vec::new(),
        });
    });
    // Restores the thread's state even if `forward` panics.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            SCOPE.with(|scope| {
                scope.borrow_mut().take();
            });
        }
    }
    let reset = Reset;
    let result = forward();
    let scope = SCOPE
        .with(|scope| scope.borrow_mut().take())
        .expect("the scope set above");
    drop(reset);
    (result, scope)
}

impl StatsTape {
    /// Runs `forward` with synchronised batch norm active on this thread (statistics summed
    /// over replicas by `reduce`) and returns its result with the tape of the layers it ran.
    ///
    /// # Panics
    /// If another recording or replay is active on this thread.
    pub fn record<R>(reduce: StatsReducer, forward: impl FnOnce() -> R) -> (R, StatsTape) {
        let (result, scope) = scoped(Mode::Record(reduce), forward);
        let Mode::Record(reduce) = scope.mode else {
            unreachable!("recorded above")
        };
        (
            result,
            StatsTape {
                cuts: scope.cuts,
                reduce: Some(reduce),
            },
        )
    }

    /// Runs `forward` again (a fresh autodiff graph), with the layers taking the statistics
    /// of this tape's cuts `range`, in order: no collective and no running-statistics
    /// update. Returns the replay's tape (cut `i` of it is cut `range.start + i` of this).
    ///
    /// # Panics
    /// If another recording or replay is active on this thread, or if `forward` runs more
    /// synchronised layers than `range` holds.
    pub fn replay<R>(&self, range: Range<usize>, forward: impl FnOnce() -> R) -> (R, StatsTape) {
        let stats = self.cuts[range]
            .iter()
            .map(|cut| {
                let mean = cut.mean.clone().detach().inner();
                let var = cut.var.clone().detach().inner();
                (mean, var, cut.elements)
            })
            .collect();
        let (result, scope) = scoped(Mode::Replay { stats, next: 0 }, forward);
        (
            result,
            StatsTape {
                cuts: scope.cuts,
                reduce: None,
            },
        )
    }

    /// Cuts recorded so far in the recording running on this thread (0 outside one): call
    /// it during `forward` to place other graph cuts in the same order.
    pub fn recorded() -> usize {
        SCOPE.with(|scope| scope.borrow().as_ref().map_or(0, |s| s.cuts.len()))
    }

    /// Number of cuts.
    pub fn len(&self) -> usize {
        self.cuts.len()
    }

    /// Whether no synchronised layer ran.
    pub fn is_empty(&self) -> bool {
        self.cuts.is_empty()
    }

    /// Adds what `grads` holds for this tape's cuts `range` to their pending gradients.
    pub fn harvest(&mut self, grads: &Gradients, range: Range<usize>) {
        for index in range {
            let (cut, mean, var) = self.leaves(index);
            self.add(index, cut.grad(grads), mean.grad(grads), var.grad(grads));
        }
    }

    /// Adds what `grads` holds for `replay`'s cuts `0..upto` to this tape's cuts
    /// `offset..offset + upto` (the cuts they replay).
    pub fn harvest_replay(
        &mut self,
        offset: usize,
        replay: &StatsTape,
        grads: &Gradients,
        upto: usize,
    ) {
        for index in 0..upto {
            let (cut, mean, var) = replay.leaves(index);
            self.add(
                offset + index,
                cut.grad(grads),
                mean.grad(grads),
                var.grad(grads),
            );
        }
    }

    fn leaves(&self, index: usize) -> (Tensor<3>, Tensor<1>, Tensor<1>) {
        let cut = &self.cuts[index];
        (cut.cut.clone(), cut.mean.clone(), cut.var.clone())
    }

    fn add(
        &mut self,
        index: usize,
        input: Option<Tensor<3>>,
        mean: Option<Tensor<1>>,
        var: Option<Tensor<1>>,
    ) {
        fn add<const D: usize>(slot: &mut Option<Tensor<D>>, grad: Option<Tensor<D>>) {
            if let Some(grad) = grad {
                *slot = Some(match slot.take() {
                    Some(sum) => sum + grad,
                    None => grad,
                });
            }
        }
        let cut = &mut self.cuts[index];
        add(&mut cut.upstream_input, input);
        add(&mut cut.upstream_mean, mean);
        add(&mut cut.upstream_var, var);
    }

    /// The complete gradient of cut `index`'s input, once every later piece of backward is
    /// done: sums the statistics' gradients over replicas and adds their effect on the
    /// input to the direct gradient. Every replica must call it for the same cuts in the
    /// same order (it is a collective).
    ///
    /// The statistics' gradients are weighted by each replica's sample count, so the
    /// result is the exact gradient of the sample-weighted mean loss over all replicas,
    /// in this replica's units (kiln-ddp scales by the sample count and divides by the
    /// total after the gradient all-reduce).
    ///
    /// # Panics
    /// On a replayed tape (statistics are reduced on the recorded one).
    pub fn complete(&mut self, index: usize) -> Tensor<3> {
        let reduce = self
            .reduce
            .as_mut()
            .expect("statistics gradients are reduced on the recorded tape");
        let cut = &mut self.cuts[index];
        let [samples, channels, length] = cut.cut.dims();
        let values = cut.cut.clone().detach().inner();
        let local = values.device();
        let direct = cut
            .upstream_input
            .take()
            .unwrap_or_else(|| Tensor::zeros([samples, channels, length], &local));
        let weight = cut.samples as f32;
        let grad_of = |slot: Option<Tensor<1>>| {
            slot.map(|g| g.into_data().convert::<f32>().try_into_vec::<f32>())
                .transpose()
                .expect("converted to f32")
                .unwrap_or_else(|| vec![0.0; channels])
        };
        let mut weighted: Vec<f32> = grad_of(cut.upstream_mean.take());
        weighted.extend(grad_of(cut.upstream_var.take()));
        weighted.iter_mut().for_each(|g| *g *= weight);
        let summed = reduce(weighted.clone()).unwrap_or(weighted);
        let scale = 1.0 / (weight * cut.elements);
        let mean_grad = vector(summed[..channels].to_vec(), &local).reshape([1, channels, 1]);
        let var_grad = vector(summed[channels..].to_vec(), &local).reshape([1, channels, 1]);
        let mean = cut.mean.clone().detach().inner().reshape([1, channels, 1]);
        // d mean / dx = 1/M, d var / dx = 2(x − mean)/M, over the whole (global) batch.
        let through_stats = (mean_grad + var_grad * (values - mean) * 2.0) * scale;
        direct + through_stats
    }

    /// Backpropagates `upstream` (from [`complete`](Self::complete)) from cut `index`'s input
    /// into the layers before it.
    pub fn backward_input(&self, index: usize, upstream: Tensor<3>) -> Gradients {
        (self.cuts[index].input.clone() * Tensor::from_inner(upstream))
            .sum()
            .backward()
    }
}
