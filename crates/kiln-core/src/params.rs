//! Enumerating a module's parameters in a stable order.
//!
//! Burn visits parameters in declaration order, which is the same on every replica of a model.
//! Data-parallel sync, checksums and sharding all rely on that order.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;

/// One float parameter of a module, as the visitor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// The parameter's id (unique per module instance).
    pub id: ParamId,
    /// The dotted path of the parameter inside the module, e.g. `layer1.0.conv1.weight`.
    pub path: String,
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// Whether the optimiser updates it (false for running statistics and frozen weights).
    pub trainable: bool,
}

impl ParamInfo {
    /// Number of scalars in the parameter.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Lists every float parameter and buffer of `module`, in visit order.
pub fn param_infos<M: Module>(module: &M) -> Vec<ParamInfo> {
    let mut collector = InfoCollector::default();
    module.visit(&mut collector);
    collector.infos
}

#[derive(Default)]
struct InfoCollector {
    path: Vec<String>,
    infos: Vec<ParamInfo>,
}

impl ModuleVisitor for InfoCollector {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        self.infos.push(ParamInfo {
            id: param.id,
            path: self.path.join("."),
            shape: value.dims().to_vec(),
            trainable: value.is_require_grad(),
        });
    }
}

/// Lists the float parameters and buffers of one segment of `model`, in visit order.
pub fn segment_param_infos<M: crate::Segmented>(
    model: &M,
    segment: crate::SegmentId,
) -> Vec<ParamInfo> {
    let mut collector = InfoCollector::default();
    model.visit_segment(segment, &mut collector);
    collector.infos
}
