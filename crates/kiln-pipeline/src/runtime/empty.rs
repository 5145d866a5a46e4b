//! A stage's module: the whole model with every parameter outside the stage emptied, so the
//! stage holds only its own parameters (and the optimizer only their state).

use std::collections::HashSet;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{Shape, Tensor};

/// Replaces every float parameter whose id is not in `keep` by an empty tensor (same id,
/// same rank, no elements).
pub(crate) fn keep_only<M: Module>(module: M, keep: &HashSet<ParamId>) -> M {
    struct Empty<'a> {
        keep: &'a HashSet<ParamId>,
    }
    impl ModuleMapper for Empty<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            if self.keep.contains(&param.id) {
                return param;
            }
            param.map(|tensor| Tensor::empty(Shape::new([0; D]), &tensor.device()))
        }
    }
    module.map(&mut Empty { keep })
}

/// Elements of every float parameter and buffer of `module` × 4 bytes.
pub(crate) fn float_bytes<M: Module>(module: &M) -> usize {
    struct Count(usize);
    impl ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0 += param.val().shape().num_elements() * 4;
        }
    }
    let mut count = Count(0);
    module.visit(&mut count);
    count.0
}
