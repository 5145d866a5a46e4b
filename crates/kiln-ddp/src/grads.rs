//! Where a replica's gradients wait for their all-reduce, which also decides what reduces
//! them (one type for the [`GradientPath`] chosen; `reduce.rs` holds the reduction).
//!
//! [`GradStore::Host`] copies every parameter's gradient into one flat `f32` buffer, which
//! the communicator reduces bucket by bucket (cheapest on CPU, where "device" memory is host
//! memory). [`GradStore::Device`] keeps each gradient on its device, flattened (widened to
//! f32 under mixed precision), and a bucket is concatenated there and reduced by its
//! [`DeviceGroup`]: a GPU then crosses to the host once per bucket (staged) or not at all
//! (Burn's native all-reduce), instead of once per parameter.

use std::ops::Range;

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use std::sync::Arc;

use burn::tensor::{DType, Device, FloatDType, Gradients, Tensor};
use kiln_comm::{CommWorker, DeviceGroup};
use kiln_train::{GradientSummary, GradientValues};

use crate::GradientPath;
use kiln_core::{FlatLayout, GradWriter};

/// A replica's accumulated gradients, in the order of a [`FlatLayout`], and what reduces them.
pub(crate) enum GradStore {
    /// One flat buffer, reduced by the communicator.
    Host(Vec<f32>),
    /// One flattened tensor per layout entry (`None` until a gradient arrives), reduced by
    /// `group` (Burn's native collective, or staged through the host).
    Device {
        /// The replica's device (without autodiff).
        device: Device,
        /// Slot `i` holds layout entry `i`'s gradient.
        slots: Vec<Option<Tensor<1>>>,
        /// What reduces a bucket (boxed: it is large, and stores move every step).
        group: Box<DeviceGroup>,
    },
}

impl GradStore {
    /// The store `path` asks for on `device`; `native` is Burn's collective over this
    /// process's replicas, when it has one for their devices.
    pub(crate) fn choose(
        path: GradientPath,
        device: &Device,
        native: Option<DeviceGroup>,
        comm: &Arc<CommWorker>,
    ) -> Self {
        let on_device = match path {
            GradientPath::Host => false,
            GradientPath::Device => true,
            GradientPath::Auto => *device != Device::flex(),
        };
        if !on_device {
            return GradStore::Host(Vec::new());
        }
        let group =
            native.unwrap_or_else(|| DeviceGroup::through_host(Arc::clone(comm), device.clone()));
        GradStore::Device {
            device: device.clone(),
            slots: Vec::new(),
            group: Box::new(group),
        }
    }

    /// How gradients travel, for reports.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            GradStore::Host(_) => "host buffer",
            GradStore::Device { group, .. } if group.is_native() => {
                "device buckets, native all-reduce"
            }
            GradStore::Device { .. } => "device buckets staged through the host",
        }
    }

    /// An empty store of the same kind, sized for `layout`.
    pub(crate) fn reset(&mut self, layout: &FlatLayout) {
        match self {
            GradStore::Host(flat) => {
                flat.clear();
                flat.resize(layout.len(), 0.0);
            }
            GradStore::Device { slots, .. } => {
                slots.clear();
                slots.resize(layout.entries().len(), None);
            }
        }
    }

    /// A visitor that moves `grads` into this store, scaled by `scale` and added to what is
    /// there (gradient accumulation over micro-batches).
    pub(crate) fn collector<'a>(
        &'a mut self,
        grads: &'a mut Gradients,
        layout: &'a FlatLayout,
        scale: f32,
    ) -> Collector<'a> {
        Collector {
            grads,
            layout,
            store: self,
            scale,
        }
    }
}

/// `range` (whole layout entries) of device gradient `slots` as one tensor on `device`.
pub(crate) fn device_bucket(
    device: &Device,
    slots: &[Option<Tensor<1>>],
    layout: &FlatLayout,
    range: Range<usize>,
) -> Tensor<1> {
    let parts: Vec<Tensor<1>> = entries_in(layout, &range)
        .map(|(index, numel)| {
            slots[index]
                .clone()
                .unwrap_or_else(|| Tensor::zeros([numel], device))
        })
        .collect();
    if parts.is_empty() {
        return Tensor::zeros([0], device);
    }
    Tensor::cat(parts, 0)
}

/// (entry index, numel) of the layout entries of `range`, which covers whole entries of a
/// contiguous layout (entries in offset order, as a bucket plan makes them).
fn entries_in<'a>(
    layout: &'a FlatLayout,
    range: &Range<usize>,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let entries = layout.entries();
    let first = entries.partition_point(|e| e.offset < range.start);
    let end = entries.partition_point(|e| e.offset < range.end);
    (first..end).map(move |index| (index, entries[index].info.numel()))
}

/// Moves gradients into a [`GradStore`] (visit a module or one of its segments with it).
pub(crate) struct Collector<'a> {
    grads: &'a mut Gradients,
    layout: &'a FlatLayout,
    store: &'a mut GradStore,
    scale: f32,
}

impl ModuleVisitor for Collector<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        match self.store {
            GradStore::Host(flat) => GradWriter {
                grads: self.grads,
                layout: self.layout,
                flat,
                scale: self.scale,
                accumulate: true,
            }
            .visit_float(param),
            GradStore::Device { slots, .. } => {
                let Some(index) = self.layout.position(param.id) else {
                    return;
                };
                let Some(grad) = param.val().grad_remove(self.grads) else {
                    return;
                };
                let numel = self.layout.entries()[index].info.numel();
                let grad = grad.reshape([numel]);
                // Mixed precision: widen half gradients (f32 ones need no copy).
                let grad = match grad.dtype() {
                    DType::F32 => grad,
                    _ => grad.cast(FloatDType::F32),
                };
                let grad = grad.mul_scalar(self.scale);
                let slot = &mut slots[index];
                *slot = Some(match slot.take() {
                    Some(sum) => sum + grad,
                    None => grad,
                });
            }
        }
    }
}

/// Reduced device buckets, each covering whole layout entries.
pub(crate) struct DeviceBuckets(pub Vec<(Range<usize>, Tensor<1>)>);

impl GradientValues for DeviceBuckets {
    fn scale(&mut self, factor: f32) {
        for (_, bucket) in &mut self.0 {
            *bucket = bucket.clone().mul_scalar(factor);
        }
    }

    /// One read per bucket. A square beyond f32's range counts as non-finite.
    fn summary(&self) -> GradientSummary {
        let mut summary = GradientSummary::default();
        for (_, bucket) in &self.0 {
            let squares = (bucket.clone() * bucket.clone()).sum().into_scalar::<f32>();
            summary.non_finite |= !squares.is_finite();
            summary.squared_norm += f64::from(squares);
        }
        summary
    }
}

/// The optimizer's gradients from reduced `buckets`, on the buckets' device.
pub(crate) fn grads_from_buckets<M: burn::module::Module>(
    module: &M,
    layout: &FlatLayout,
    buckets: DeviceBuckets,
) -> GradientsParams {
    // Split every bucket into its parameters' flat gradients, indexed by layout entry.
    let mut parts: Vec<Option<Tensor<1>>> = vec![None; layout.entries().len()];
    for (range, bucket) in buckets.0 {
        let (indices, sizes): (Vec<usize>, Vec<usize>) = entries_in(layout, &range).unzip();
        if indices.is_empty() {
            continue;
        }
        let pieces = if indices.len() == 1 {
            vec![bucket]
        } else {
            bucket.split_with_sizes(sizes, 0)
        };
        for (index, piece) in indices.into_iter().zip(pieces) {
            parts[index] = Some(piece);
        }
    }
    struct Reader<'a> {
        layout: &'a FlatLayout,
        parts: Vec<Option<Tensor<1>>>,
        out: GradientsParams,
    }
    impl ModuleVisitor for Reader<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let Some(index) = self.layout.position(param.id) else {
                return;
            };
            if let Some(flat) = self.parts[index].take() {
                let shape: [usize; D] = self.layout.entries()[index]
                    .info
                    .shape
                    .clone()
                    .try_into()
                    .expect("the layout records the parameter's rank");
                self.out.register(param.id, flat.reshape(shape));
            }
        }
    }
    let mut reader = Reader {
        layout,
        parts,
        out: GradientsParams::new(),
    };
    module.visit(&mut reader);
    reader.out
}
