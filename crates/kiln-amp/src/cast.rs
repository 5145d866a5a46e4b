//! Casting a module's parameters for the working copy.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{DType, FloatDType, Tensor};

use crate::AmpPolicy;

struct Cast<'a> {
    dtype: FloatDType,
    policy: &'a AmpPolicy,
    path: Vec<String>,
}

impl ModuleMapper for Cast<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let keep = self.policy.keeps_f32(&self.path.join("."));
        let dtype = self.dtype;
        param.map(|tensor| {
            // Buffers (running statistics) and kept layers stay as they are. A cast leaf is
            // made from the inner tensor so that it is a fresh leaf of the working copy, not a
            // node hanging off the master.
            if keep || !tensor.is_require_grad() || tensor.dtype() == DType::from(dtype) {
                return tensor;
            }
            Tensor::from_inner(tensor.inner().cast(dtype)).require_grad()
        })
    }
}

/// `module` with its trainable parameters cast to `dtype`, except those `policy` keeps.
/// Parameter ids are kept, so gradients of the copy address the original's parameters.
pub fn cast_module<M: Module>(module: M, dtype: FloatDType, policy: &AmpPolicy) -> M {
    module.map(&mut Cast {
        dtype,
        policy,
        path: Vec::new(),
    })
}

/// The dtype of every float parameter and buffer, in visit order (for checks and tests).
pub fn module_dtypes<M: Module>(module: &M) -> Vec<DType> {
    struct Dtypes(Vec<DType>);
    impl ModuleVisitor for Dtypes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().dtype());
        }
    }
    let mut dtypes = Dtypes(Vec::new());
    module.visit(&mut dtypes);
    dtypes.0
}
