//! Reduction operators.

/// How an all-reduce or reduce-scatter combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean (sum ÷ world size).
    Mean,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    /// Folds `value` into `acc`.
    #[inline]
    pub(crate) fn combine(self, acc: &mut [f32], value: &[f32]) {
        match self {
            ReduceOp::Sum | ReduceOp::Mean => acc.iter_mut().zip(value).for_each(|(a, v)| *a += v),
            ReduceOp::Max => acc.iter_mut().zip(value).for_each(|(a, v)| *a = a.max(*v)),
            ReduceOp::Min => acc.iter_mut().zip(value).for_each(|(a, v)| *a = a.min(*v)),
        }
    }

    /// Applies the final step once every rank's values are combined.
    #[inline]
    pub(crate) fn finish(self, acc: &mut [f32], world_size: usize) {
        if self == ReduceOp::Mean && world_size > 1 {
            let scale = world_size as f32;
            acc.iter_mut().for_each(|a| *a /= scale);
        }
    }
}
