//! The shifted-GEMM path against im2col (the reference the convolution tests hold to Burn).

use crate::conv::dims::ConvDims;
use crate::conv::flex::{im2col_forward, im2col_weight_gradient};
use crate::conv::geometry::ConvGeometry;
use crate::conv::shifted;
use crate::test_support::{conv_dims as dims, in_pool, relative_error, values};

/// (dims, out channels, batch): every case takes the shifted path.
fn cases() -> Vec<(ConvDims, usize, usize)> {
    let g = ConvGeometry::new;
    vec![
        (
            dims(8, [16, 16], [3, 3], g().with_padding([(1, 1), (1, 1)])),
            5,
            2,
        ),
        (
            dims(9, [17, 19], [3, 3], g().with_padding([(1, 1), (1, 1)])),
            16,
            3,
        ),
        (dims(8, [18, 20], [3, 3], g()), 4, 2),
        (
            dims(10, [16, 17], [5, 3], g().with_padding([(2, 2), (0, 2)])),
            3,
            1,
        ),
        (
            dims(
                8,
                [20, 18],
                [3, 2],
                g().with_dilation([2, 3]).with_padding([(2, 2), (3, 0)]),
            ),
            6,
            2,
        ),
        (dims(12, [16, 16], [1, 1], g()), 7, 2),
        (
            dims(8, [16, 16], [3, 3], g().with_padding([(3, 0), (0, 3)])),
            2,
            1,
        ),
        // Taps that reach past a narrow image: some column copies are all padding.
        (
            dims(
                8,
                [64, 4],
                [3, 3],
                g().with_dilation([8, 8]).with_padding([(8, 8), (8, 8)]),
            ),
            3,
            1,
        ),
        (
            dims(8, [256, 1], [1, 3], g().with_padding([(0, 0), (0, 2)])),
            2,
            1,
        ),
    ]
}

#[test]
fn shifted_equals_im2col_forward_and_weight_gradient() {
    for (d, out_channels, batch) in cases() {
        assert!(shifted::applies(&d), "{d:?}");
        let x = values(batch * d.image_len(), 1);
        let weight = values(out_channels * d.rows(), 2);
        let grad = values(batch * out_channels * d.positions(), 3);
        let forward = shifted::forward(&x, &weight, &d, batch, out_channels);
        let reference = im2col_forward(&x, &weight, &d, batch, out_channels);
        let err = relative_error(&forward, &reference);
        assert!(err < 1e-5, "forward {d:?}: {err}");
        let wg = shifted::weight_gradient(&x, &grad, &d, batch, out_channels);
        let reference = im2col_weight_gradient(&x, &grad, &d, batch, out_channels);
        let err = relative_error(&wg, &reference);
        assert!(err < 1e-5, "weight gradient {d:?}: {err}");
    }
}

/// Controls: a changed weight and a changed output gradient move the results past the
/// tolerance, so the comparison above can fail.
#[test]
fn the_comparison_detects_a_wrong_tap() {
    let (d, out_channels, batch) = cases().remove(1);
    let x = values(batch * d.image_len(), 1);
    let mut weight = values(out_channels * d.rows(), 2);
    let reference = im2col_forward(&x, &weight, &d, batch, out_channels);
    weight[4] += 0.5;
    let forward = shifted::forward(&x, &weight, &d, batch, out_channels);
    assert!(relative_error(&forward, &reference) > 1e-2);
    let mut grad = values(batch * out_channels * d.positions(), 3);
    let reference = im2col_weight_gradient(&x, &grad, &d, batch, out_channels);
    let last = grad.len() - 1;
    grad[last] += 4.0;
    let wg = shifted::weight_gradient(&x, &grad, &d, batch, out_channels);
    assert!(relative_error(&wg, &reference) > 1e-2);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let (d, out_channels, batch) = (
        dims(
            8,
            [16, 16],
            [3, 3],
            ConvGeometry::new().with_padding([(1, 1), (1, 1)]),
        ),
        8,
        11,
    );
    let x = values(batch * d.image_len(), 4);
    let weight = values(out_channels * d.rows(), 5);
    let grad = values(batch * out_channels * d.positions(), 6);
    let run = |threads: usize| {
        in_pool(threads, || {
            (
                shifted::forward(&x, &weight, &d, batch, out_channels),
                shifted::weight_gradient(&x, &grad, &d, batch, out_channels),
            )
        })
    };
    assert_eq!(run(1), run(3));
}
