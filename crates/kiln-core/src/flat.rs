//! Moving a module's gradients and parameters in and out of flat `f32` buffers.
//!
//! Collectives work on flat buffers; Burn keeps one tensor per parameter. A [`FlatLayout`]
//! fixes where each parameter lives in a buffer (the same on every replica, since it is
//! derived from the module's visit order), and four small visitors move data across:
//! [`GradWriter`] (gradients → buffer), [`grads_from_flat`] (buffer → `GradientsParams`),
//! [`ParamReader`] (values → buffer) and [`ParamWriter`] (buffer → values).

use rayon::prelude::*;
use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Gradients, Tensor, TensorData};

use crate::ParamInfo;

/// One parameter's place in a flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatEntry {
    /// The parameter.
    pub info: ParamInfo,
    /// Index of its first element in the buffer.
    pub offset: usize,
}

/// Where each parameter lives in a flat buffer.
#[derive(Debug, Clone, Default)]
pub struct FlatLayout {
    entries: Vec<FlatEntry>,
    index: HashMap<ParamId, usize>,
    len: usize,
}

impl FlatLayout {
    /// Packs `params` contiguously in the given order.
    pub fn new(params: impl IntoIterator<Item = ParamInfo>) -> Self {
        let mut layout = Self::default();
        for info in params {
            let numel = info.numel();
            layout.index.insert(info.id, layout.entries.len());
            layout.entries.push(FlatEntry {
                info,
                offset: layout.len,
            });
            layout.len += numel;
        }
        layout
    }

    /// Places each parameter at an explicit offset in a buffer of `len` elements (leaving
    /// gaps, e.g. padding for equal-sized shards).
    ///
    /// # Panics
    /// If an entry does not fit in `len`.
    pub fn with_offsets(entries: impl IntoIterator<Item = (ParamInfo, usize)>, len: usize) -> Self {
        let mut layout = Self {
            len,
            ..Self::default()
        };
        for (info, offset) in entries {
            assert!(
                offset + info.numel() <= len,
                "`{}` does not fit in the buffer",
                info.path
            );
            layout.index.insert(info.id, layout.entries.len());
            layout.entries.push(FlatEntry { info, offset });
        }
        layout
    }

    /// Total elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the layout holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries in buffer order.
    pub fn entries(&self) -> &[FlatEntry] {
        &self.entries
    }

    /// The entry of parameter `id`.
    pub fn get(&self, id: ParamId) -> Option<&FlatEntry> {
        self.index.get(&id).map(|&i| &self.entries[i])
    }

    /// The index in [`entries`](Self::entries) of parameter `id`.
    pub fn position(&self, id: ParamId) -> Option<usize> {
        self.index.get(&id).copied()
    }
}

/// Elements per parallel piece of a gradient copy.
const PIECE: usize = 1 << 14;

fn tensor_values<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("converted to f32")
}

/// Copies gradients from autodiff `Gradients` into a flat buffer, scaled by `scale`.
///
/// Visit a module (or one segment of it) with this writer. Parameters of the layout that
/// have no gradient (unused in this pass) are written as zeros; parameters outside the
/// layout are skipped. With `accumulate`, values are added to the buffer instead of
/// overwriting it (gradient accumulation over micro-batches).
pub struct GradWriter<'a> {
    /// The gradients of one backward pass.
    pub grads: &'a mut Gradients,
    /// The buffer's layout.
    pub layout: &'a FlatLayout,
    /// The buffer.
    pub flat: &'a mut [f32],
    /// Factor applied to every gradient.
    pub scale: f32,
    /// Add instead of overwrite.
    pub accumulate: bool,
}

impl ModuleVisitor for GradWriter<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(entry) = self.layout.get(param.id) else {
            return;
        };
        let target = &mut self.flat[entry.offset..entry.offset + entry.info.numel()];
        match param.val().grad_remove(self.grads) {
            Some(grad) => {
                let values = tensor_values(grad);
                let scale = self.scale;
                // In pieces over the caller's rayon pool (a replica's threads): each element
                // is computed alike whichever thread takes its piece.
                let pieces = target.par_chunks_mut(PIECE).zip(values.par_chunks(PIECE));
                if self.accumulate {
                    pieces
                        .for_each(|(t, v)| t.iter_mut().zip(v).for_each(|(t, v)| *t += v * scale));
                } else if scale == 1.0 {
                    pieces.for_each(|(t, v)| t.copy_from_slice(v));
                } else {
                    pieces.for_each(|(t, v)| t.iter_mut().zip(v).for_each(|(t, v)| *t = v * scale));
                }
            }
            None if !self.accumulate => target.fill(0.0),
            None => {}
        }
    }
}

/// Builds `GradientsParams` for every parameter of `layout` from `flat`, on the device the
/// optimizer expects them: the module's device, without autodiff.
pub fn grads_from_flat<M: Module>(
    module: &M,
    layout: &FlatLayout,
    flat: &[f32],
) -> GradientsParams {
    let device = module
        .devices()
        .first()
        .cloned()
        .unwrap_or_default()
        .without_autodiff();
    struct Reader<'a> {
        layout: &'a FlatLayout,
        flat: &'a [f32],
        device: &'a Device,
        out: GradientsParams,
    }
    impl ModuleVisitor for Reader<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(entry) = self.layout.get(param.id) {
                let values = self.flat[entry.offset..entry.offset + entry.info.numel()].to_vec();
                let tensor = Tensor::<D>::from_data(
                    TensorData::new(values, entry.info.shape.clone()),
                    self.device,
                );
                self.out.register(param.id, tensor);
            }
        }
    }
    let mut reader = Reader {
        layout,
        flat,
        device: &device,
        out: GradientsParams::new(),
    };
    module.visit(&mut reader);
    reader.out
}

/// Copies parameter values into a flat buffer (visit a module with it).
pub struct ParamReader<'a> {
    /// The buffer's layout.
    pub layout: &'a FlatLayout,
    /// The buffer.
    pub flat: &'a mut [f32],
}

impl ModuleVisitor for ParamReader<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(entry) = self.layout.get(param.id) {
            let values = tensor_values(param.val());
            self.flat[entry.offset..entry.offset + values.len()].copy_from_slice(&values);
        }
    }
}

/// Replaces parameter values with those of a flat buffer (map a module with it), keeping
/// each parameter's id and whether it requires a gradient.
pub struct ParamWriter<'a> {
    /// The buffer's layout.
    pub layout: &'a FlatLayout,
    /// The buffer.
    pub flat: &'a [f32],
}

impl ModuleMapper for ParamWriter<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(entry) = self.layout.get(param.id) else {
            return param;
        };
        let values = self.flat[entry.offset..entry.offset + entry.info.numel()].to_vec();
        let shape = entry.info.shape.clone();
        param.map(|tensor| {
            let require_grad = tensor.is_require_grad();
            let device = tensor.device();
            Tensor::<D>::from_data(TensorData::new(values, shape), &device)
                .set_require_grad(require_grad)
        })
    }
}

/// Flattens every float parameter and buffer of `module` (in visit order) into a buffer.
///
/// Burn's `RunningState` (batch-norm statistics) keeps each thread's latest update aside
/// until the next forward or a `valid()`/`train()` switch, and visitors see only the settled
/// value. When the layout holds such buffers (non-trainable entries), reading first settles
/// them (a `valid()` copy, dropped at once, merges the pending updates into the shared
/// state), so replicas compare and average their latest statistics.
pub fn read_params<M: Module>(module: &M, layout: &FlatLayout) -> Vec<f32> {
    if layout.entries().iter().any(|e| !e.info.trainable) {
        drop(module.valid());
    }
    let mut flat = vec![0.0; layout.len()];
    module.visit(&mut ParamReader {
        layout,
        flat: &mut flat,
    });
    flat
}

/// Writes `flat` back into `module`'s parameters.
pub fn write_params<M: Module>(module: M, layout: &FlatLayout, flat: &[f32]) -> M {
    module.map(&mut ParamWriter { layout, flat })
}

/// A 64-bit FNV-1a fingerprint of the bit patterns of every float parameter and buffer of
/// `module`: equal fingerprints mean (all but certainly) bit-identical models.
pub fn fingerprint<M: Module>(module: &M) -> u64 {
    let layout = FlatLayout::new(crate::param_infos(module));
    fingerprint_values(&read_params(module, &layout))
}

/// FNV-1a over the bit patterns of `values`.
pub fn fingerprint_values(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325, |hash, v| {
        (hash ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
    })
}
