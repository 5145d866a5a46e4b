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

    /// Overwrites `out` with `a` combined with `b`, in one pass (cheaper than copying `a` and
    /// folding `b` in when `out` is not in cache).
    #[inline]
    pub(crate) fn combine_into(self, out: &mut Vec<f32>, a: &[f32], b: &[f32]) {
        out.clear();
        let pairs = a.iter().zip(b);
        match self {
            ReduceOp::Sum | ReduceOp::Mean => out.extend(pairs.map(|(x, y)| x + y)),
            ReduceOp::Max => out.extend(pairs.map(|(x, y)| x.max(*y))),
            ReduceOp::Min => out.extend(pairs.map(|(x, y)| x.min(*y))),
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

/// Why all-gather buffers do not fit a world of `world` ranks (`output` must hold `world`
/// inputs), or `None` if they do.
pub(crate) fn gather_mismatch(world: usize, input: usize, output: usize) -> Option<String> {
    (output != world * input)
        .then(|| format!("output has {output} elements, expected {world} × {input}"))
}

/// Why reduce-scatter buffers do not fit a world of `world` ranks (`input` must hold `world`
/// outputs), or `None` if they do.
pub(crate) fn scatter_mismatch(world: usize, input: usize, output: usize) -> Option<String> {
    (input != world * output)
        .then(|| format!("input has {input} elements, expected {world} × {output}"))
}
