//! Winograd's forward and weight gradient equal the im2col path's (which the convolution
//! tests compare with Burn's) to 1e-5 of the largest value, for odd and even sizes and every
//! padding a 3×3 kernel allows, in blocks of a few images and of many (the transforms across
//! images), and do not depend on the thread count.

use crate::conv::dims::ConvDims;
use crate::conv::flex::{im2col_forward, im2col_weight_gradient};
use crate::conv::geometry::ConvGeometry;
use crate::conv::winograd::f2::{self, MIN_CHANNELS, MIN_OUTPUT};
use crate::test_support::{conv_dims, in_pool, relative_error, values};

const TOLERANCE: f32 = 1e-5;

/// (channels, out channels, input, padding, batch)
type Case = (usize, usize, [usize; 2], [(usize, usize); 2], usize);

fn cases() -> Vec<Case> {
    vec![
        (3, 5, [8, 8], [(1, 1), (1, 1)], 2),
        (4, 3, [7, 9], [(1, 1), (1, 1)], 3),
        (2, 4, [6, 5], [(0, 0), (0, 0)], 2),
        (3, 2, [5, 7], [(2, 2), (2, 2)], 1),
        (2, 3, [9, 6], [(0, 2), (1, 0)], 2),
        (5, 4, [3, 3], [(1, 1), (1, 1)], 40),
        (MIN_CHANNELS, MIN_CHANNELS + 8, [4, 4], [(1, 1), (1, 1)], 5),
        // Small images in blocks of 8 or more: the transforms across images
        // (`winograd/batched.rs`), odd outputs and asymmetric paddings among them.
        (3, 2, [5, 7], [(2, 2), (2, 2)], 12),
        (2, 3, [9, 6], [(0, 2), (1, 0)], 17),
        (2, 4, [6, 5], [(0, 0), (0, 0)], 20),
        (4, 3, [8, 8], [(1, 1), (1, 1)], 35),
    ]
}

fn dims(channels: usize, input: [usize; 2], padding: [(usize, usize); 2]) -> ConvDims {
    conv_dims(
        channels,
        input,
        [3, 3],
        ConvGeometry::new().with_padding(padding),
    )
}

#[test]
fn winograd_equals_im2col_forward_and_weight_gradient() {
    for (index, &(cin, cout, input, padding, batch)) in cases().iter().enumerate() {
        let d = dims(cin, input, padding);
        let seed = index as u64;
        let x = values(batch * d.image_len(), seed);
        let weight = values(cout * cin * 9, seed + 100);
        let grad = values(batch * cout * d.positions(), seed + 200);
        let forward = f2::forward(&x, &weight, &d, batch, cout);
        let expected = im2col_forward(&x, &weight, &d, batch, cout);
        let error = relative_error(&forward, &expected);
        assert!(error < TOLERANCE, "forward {d:?}: {error}");
        let weight_grad = f2::weight_gradient(&x, &grad, &d, batch, cout);
        let expected = im2col_weight_gradient(&x, &grad, &d, batch, cout);
        let error = relative_error(&weight_grad, &expected);
        assert!(error < TOLERANCE, "weight gradient {d:?}: {error}");
    }
}

/// The control: a kernel with one tap changed must fail the forward comparison, and a
/// gradient with one output dropped the weight gradient's.
#[test]
fn a_changed_tap_or_dropped_output_fails_the_comparison() {
    let (cin, cout, batch) = (3, 4, 2);
    let d = dims(cin, [6, 6], [(1, 1), (1, 1)]);
    let x = values(batch * d.image_len(), 1);
    let weight = values(cout * cin * 9, 2);
    let grad = values(batch * cout * d.positions(), 3);
    let mut changed = weight.clone();
    changed[13] += 0.5;
    let error = relative_error(
        &f2::forward(&x, &changed, &d, batch, cout),
        &im2col_forward(&x, &weight, &d, batch, cout),
    );
    assert!(error > 100.0 * TOLERANCE, "{error}");
    let mut dropped = grad.clone();
    dropped[7] = 0.0;
    let error = relative_error(
        &f2::weight_gradient(&x, &dropped, &d, batch, cout),
        &im2col_weight_gradient(&x, &grad, &d, batch, cout),
    );
    assert!(error > 100.0 * TOLERANCE, "{error}");
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let (cin, cout, batch) = (MIN_CHANNELS, MIN_CHANNELS + 3, 11);
    let d = dims(cin, [MIN_OUTPUT, MIN_OUTPUT + 1], [(1, 1), (1, 1)]);
    let x = values(batch * d.image_len(), 4);
    let weight = values(cout * cin * 9, 5);
    let grad = values(batch * cout * d.positions(), 6);
    let run = |threads: usize| {
        in_pool(threads, || {
            (
                f2::forward(&x, &weight, &d, batch, cout),
                f2::weight_gradient(&x, &grad, &d, batch, cout),
            )
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn only_unit_stride_3x3_kernels_with_enough_channels_take_winograd() {
    // (`applies` reads the fields only: each case below differs from `d` in one.)
    let d = dims(MIN_CHANNELS, [MIN_OUTPUT, MIN_OUTPUT], [(1, 1), (1, 1)]);
    assert!(f2::applies(&d, MIN_CHANNELS));
    let small = dims(
        MIN_CHANNELS,
        [MIN_OUTPUT + 1, MIN_OUTPUT - 1],
        [(0, 0), (1, 1)],
    );
    assert!(!f2::applies(&small, MIN_CHANNELS));
    assert!(!f2::applies(&d, MIN_CHANNELS - 1));
    assert!(!f2::applies(
        &dims(MIN_CHANNELS - 1, [MIN_OUTPUT, MIN_OUTPUT], [(1, 1), (1, 1)]),
        MIN_CHANNELS
    ));
    // The weight gradient also at 4×4 for up to 128 × 128 channels.
    let four = dims(128, [4, 4], [(1, 1), (1, 1)]);
    assert!(!f2::applies(&four, 128));
    assert!(f2::applies_to_weight_gradient(&four, 128));
    assert!(!f2::applies_to_weight_gradient(&four, 129));
    let three = dims(128, [3, 3], [(1, 1), (1, 1)]);
    assert!(!f2::applies_to_weight_gradient(&three, 128));
    // Where the shifted GEMMs apply (16×16 here), only from 128 × 128 channel pairs.
    let sixteen = dims(128, [16, 16], [(1, 1), (1, 1)]);
    assert!(f2::applies_to_weight_gradient(&sixteen, 128));
    assert!(!f2::applies_to_weight_gradient(&sixteen, 127));
    let eight = dims(MIN_CHANNELS, [8, 8], [(1, 1), (1, 1)]);
    assert!(f2::applies_to_weight_gradient(&eight, MIN_CHANNELS));
    let strided = ConvDims {
        geometry: d.geometry.with_stride([2, 2]),
        ..d
    };
    assert!(!f2::applies(&strided, MIN_CHANNELS));
    let dilated = ConvDims {
        geometry: d.geometry.with_dilation([2, 2]),
        ..d
    };
    assert!(!f2::applies(&dilated, MIN_CHANNELS));
    let one_by_one = ConvDims {
        kernel: [1, 1],
        ..d
    };
    assert!(!f2::applies(&one_by_one, MIN_CHANNELS));
}
