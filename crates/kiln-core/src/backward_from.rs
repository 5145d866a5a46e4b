//! Backward from an intermediate tensor given its gradient: how backward segment by segment
//! and pipeline stages start each piece of a model's backward.

use burn::backend::DispatchDevice;
use burn::tensor::{DType, Gradients, Tensor};

use crate::seed_extension::SeedKernel;

/// The gradients of everything `x` was computed from, given `upstream` as the gradient of `x`:
/// what `(x * upstream.detach()).sum().backward()` gives, bit for bit, without that
/// expression's four single-threaded passes over the tensor (product, sum, the sum's gradient
/// of ones, their product with `upstream`). On Burn's CPU backend (Flex) in f32 a seed hands
/// `upstream` to `x` as it is; other backends, dtypes and shapes run Burn's expression.
///
/// ```
/// use burn::tensor::{Device, Tensor};
///
/// let device = Device::flex().autodiff();
/// let w = Tensor::<1>::from_floats([1.0, 2.0, 3.0], &device).require_grad();
/// let y = w.clone() * 2.0;
/// let upstream = Tensor::<1>::from_floats([0.5, -1.0, 4.0], &device);
/// let grads = kiln_core::backward_from(&y, upstream);
/// let grad = w.grad(&grads).unwrap().to_data().try_to_vec::<f32>().unwrap();
/// assert_eq!(grad, vec![1.0, -2.0, 8.0]);
/// ```
///
/// # Panics
///
/// As [`Tensor::backward`]: if `x` is not tracked by autodiff or its graph was consumed.
pub fn backward_from<const D: usize>(x: &Tensor<D>, upstream: Tensor<D>) -> Gradients {
    let upstream = upstream.detach();
    let on_flex = matches!(x.device().inner().as_dispatch(), DispatchDevice::Flex(_));
    let fits = on_flex
        && x.dtype() == DType::F32
        && upstream.dtype() == DType::F32
        && x.shape() == upstream.shape()
        && x.device() == upstream.device();
    if !fits {
        return (x.clone() * upstream).sum().backward();
    }
    let seed = Tensor::<1>::from_dispatch(<burn::backend::Dispatch as SeedKernel>::kiln_seeded(
        x.clone().into_dispatch(),
        upstream.into_dispatch(),
    ));
    seed.backward()
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution, Tensor};

    use super::backward_from;
    use crate::with_seed;

    fn bits(t: Tensor<4>) -> Vec<u32> {
        let values = t.into_data().try_to_vec::<f32>().expect("f32");
        values.into_iter().map(f32::to_bits).collect()
    }

    /// A leaf used twice (its gradient is a sum) and an intermediate `h` of it.
    fn graph(device: &Device) -> (Tensor<4>, Tensor<4>) {
        let x = with_seed(device, 1, || {
            Tensor::<4>::random([2, 3, 8, 5], Distribution::Normal(0.0, 1.0), device)
        })
        .require_grad();
        let h = (x.clone() * 0.5).tanh() * 3.0 + x.clone().exp();
        (x, h)
    }

    #[test]
    fn the_seed_gives_the_gradients_of_burns_expression_bit_for_bit() {
        let device = Device::flex().autodiff();
        let upstream = |seed| {
            with_seed(&device, seed, || {
                Tensor::<4>::random([2, 3, 8, 5], Distribution::Normal(0.0, 1.0), &device)
            })
        };
        let (x, h) = graph(&device);
        let ours = x.grad(&backward_from(&h, upstream(2))).expect("gradient");
        let (x, h) = graph(&device);
        let burns = x
            .grad(&(h * upstream(2)).sum().backward())
            .expect("gradient");
        assert_eq!(bits(ours.clone()), bits(burns));
        // Control: another upstream gradient shows.
        let (x, h) = graph(&device);
        let other = x.grad(&backward_from(&h, upstream(3))).expect("gradient");
        assert_ne!(bits(ours), bits(other));
    }

    #[test]
    #[should_panic(expected = "tracked")]
    fn an_untracked_tensor_panics_as_burns_backward_does() {
        let device = Device::flex().autodiff();
        let x = Tensor::<1>::from_floats([1.0, 2.0], &device);
        backward_from(&x, x.clone());
    }
}
