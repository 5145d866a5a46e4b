//! The entry point: causal self-attention on kiln's kernel where it applies and Burn's
//! attention otherwise.

use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, Tensor};

use super::extension::AttentionKernel;
use crate::conv::entry::on_flex;

/// Causal multi-head self-attention of projected rows: `query`, `key` and `value` are
/// `[batch, time, width]`, each row holding `heads` heads of `width / heads` columns side by
/// side (a linear layer's output, before any reshape); position `i` attends to positions
/// `0..=i` with scores scaled by `1/√(width / heads)`; the result has the same layout, ready
/// for the output projection. No dropout on the attention weights.
///
/// On Burn's CPU backend (Flex, with or without autodiff) in f32 it runs kiln's kernel:
/// heads read in place, one batch element per thread, one backward step that recomputes the
/// probabilities from each row's log-sum-exp (no `time²` tensor kept per head); equal to
/// Burn's attention within float rounding (the tests bound it). Other backends and dtypes
/// run Burn's [`attention`] with `is_causal`.
///
/// ```
/// use burn::tensor::{Device, Distribution, Tensor};
///
/// let device = Device::flex().autodiff();
/// let x = || Tensor::<3>::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &device);
/// let (q, k, v) = (x().require_grad(), x(), x());
/// let context = kiln_kernels::causal_attention(q.clone(), k, v, 2);
/// assert_eq!(context.dims(), [2, 5, 8]);
/// let grads = context.sum().backward();
/// assert_eq!(q.grad(&grads).unwrap().dims(), [2, 5, 8]);
/// ```
///
/// # Panics
///
/// If the three shapes differ, `heads` is zero, or the width is not a multiple of `heads`
/// (a programmer's error in the model's configuration).
pub fn causal_attention(
    query: Tensor<3>,
    key: Tensor<3>,
    value: Tensor<3>,
    heads: usize,
) -> Tensor<3> {
    let [batch, time, width] = query.dims();
    assert!(
        key.dims() == query.dims() && value.dims() == query.dims(),
        "causal_attention: query {:?}, key {:?} and value {:?} differ in shape",
        query.dims(),
        key.dims(),
        value.dims()
    );
    assert!(
        heads > 0 && width.is_multiple_of(heads),
        "causal_attention: the width {width} does not split into {heads} heads"
    );
    let kernel = [&query, &key, &value]
        .iter()
        .all(|t| on_flex(t) && t.dtype() == DType::F32)
        && query.device() == key.device()
        && query.device() == value.device()
        && batch * time > 0;
    if kernel {
        return Tensor::from_dispatch(
            <burn::backend::Dispatch as AttentionKernel>::kiln_causal_attention(
                query.into_dispatch(),
                key.into_dispatch(),
                value.into_dispatch(),
                heads,
            ),
        );
    }
    let split = |x: Tensor<3>| {
        x.reshape([batch, time, heads, width / heads])
            .swap_dims(1, 2)
    };
    let options = AttentionModuleOptions {
        is_causal: true,
        ..Default::default()
    };
    attention(split(query), split(key), split(value), None, None, options)
        .swap_dims(1, 2)
        .reshape([batch, time, width])
}
