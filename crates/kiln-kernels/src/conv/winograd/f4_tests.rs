//! Winograd F(4×4, 3×3)'s forward equals the im2col path's (which the convolution tests
//! compare with Burn's) to [`TOLERANCE`] of the largest value, for odd and even sizes, output
//! sizes that are not multiples of 4 and every padding a 3×3 kernel allows, in blocks of one
//! image and of many, and does not depend on the thread count.

use crate::conv::dims::ConvDims;
use crate::conv::flex::{forward_values, im2col_forward, input_gradient};
use crate::conv::geometry::ConvGeometry;
use crate::conv::winograd::f2::{self, MIN_CHANNELS};
use crate::conv::winograd::f4::{self, MIN_OUTPUT, NARROW_MIN_CHANNELS, WIDE_OUTPUT};
use crate::test_support::{conv_dims, in_pool, relative_error, values};

/// F(4×4, 3×3) rounds more than F(2×2, 3×3) (whose tests hold it to 1e-5): its transforms
/// scale by up to 8 going in and by 1⁄24 on the kernel. Measured (the F(4×4) timings of `cargo xtask bench --only kernels`'s shapes): 5e-6
/// to 1e-5 of the largest output at 32–128 channels, 1.5e-5 at 256; the margin covers other
/// CPUs' GEMM kernels, which sum in other orders.
const TOLERANCE: f32 = 3e-5;

/// (channels, out channels, input, padding, batch)
type Case = (usize, usize, [usize; 2], [(usize, usize); 2], usize);

fn cases() -> Vec<Case> {
    vec![
        (3, 5, [16, 16], [(1, 1), (1, 1)], 8),
        (4, 3, [17, 19], [(1, 1), (1, 1)], 9),
        (2, 4, [18, 21], [(0, 0), (0, 0)], 8),
        (3, 2, [15, 14], [(2, 2), (2, 2)], 1),
        (2, 3, [19, 16], [(0, 2), (1, 0)], 11),
        (5, 4, [4, 6], [(1, 1), (1, 1)], 3),
        (64, 24, [32, 32], [(1, 1), (1, 1)], 17),
        (40, 64, [16, 16], [(1, 1), (1, 1)], 20),
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
fn winograd4_equals_im2col_forward() {
    for (index, &(cin, cout, input, padding, batch)) in cases().iter().enumerate() {
        let d = dims(cin, input, padding);
        let seed = index as u64;
        let x = values(batch * d.image_len(), seed);
        let weight = values(cout * cin * 9, seed + 100);
        let forward = f4::forward(&x, &weight, &d, batch, cout);
        let expected = im2col_forward(&x, &weight, &d, batch, cout);
        let error = relative_error(&forward, &expected);
        assert!(error < TOLERANCE, "forward {d:?}: {error}");
    }
}

/// The control: a kernel with one tap changed, or one input value, must fail the comparison.
#[test]
fn a_changed_tap_or_input_fails_the_comparison() {
    let (cin, cout, batch) = (3, 4, 9);
    let d = dims(cin, [17, 18], [(1, 1), (1, 1)]);
    let x = values(batch * d.image_len(), 1);
    let weight = values(cout * cin * 9, 2);
    let expected = im2col_forward(&x, &weight, &d, batch, cout);
    let mut changed = weight.clone();
    changed[13] += 0.5;
    let error = relative_error(&f4::forward(&x, &changed, &d, batch, cout), &expected);
    assert!(error > 100.0 * TOLERANCE, "{error}");
    // The last input row and column, which only the last (partly dropped) tiles read.
    let mut moved = x.clone();
    *moved.last_mut().expect("an input") += 1.0;
    let error = relative_error(&f4::forward(&moved, &weight, &d, batch, cout), &expected);
    assert!(error > 100.0 * TOLERANCE, "{error}");
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let (cin, cout, batch) = (MIN_CHANNELS, MIN_CHANNELS + 3, 19);
    let d = dims(cin, [MIN_OUTPUT + 2, MIN_OUTPUT + 5], [(1, 1), (1, 1)]);
    let x = values(batch * d.image_len(), 4);
    let weight = values(cout * cin * 9, 5);
    let run = |threads: usize| in_pool(threads, || f4::forward(&x, &weight, &d, batch, cout));
    assert_eq!(run(1), run(3));
}

#[test]
fn only_outputs_of_at_least_16_take_f4x4_and_the_input_gradient_follows() {
    let c = NARROW_MIN_CHANNELS;
    let d = dims(c, [MIN_OUTPUT, MIN_OUTPUT], [(1, 1), (1, 1)]);
    assert!(f4::applies(&d, c));
    assert!(!f4::applies(&d, c - 1));
    let narrow = dims(c, [MIN_OUTPUT, MIN_OUTPUT - 1], [(1, 1), (1, 1)]);
    assert!(!f4::applies(&narrow, c));
    assert!(f2::applies(&narrow, c));
    // Wide outputs from fewer channels.
    let wide = dims(MIN_CHANNELS, [WIDE_OUTPUT, WIDE_OUTPUT], [(1, 1), (1, 1)]);
    assert!(f4::applies(&wide, MIN_CHANNELS));
    assert!(!f4::applies(&wide, MIN_CHANNELS - 1));
    let below_wide = dims(
        MIN_CHANNELS,
        [WIDE_OUTPUT, WIDE_OUTPUT - 1],
        [(1, 1), (1, 1)],
    );
    assert!(!f4::applies(&below_wide, MIN_CHANNELS));
    // The dispatch: the forward of a 16×16 shape is F(4×4)'s, bit for bit, and so is its
    // input gradient (a forward over the output gradient with the flipped kernel).
    let (batch, cout) = (2, c);
    let x = values(batch * d.image_len(), 7);
    let weight = values(cout * d.channels * 9, 8);
    assert_eq!(
        forward_values(&x, &weight, &d, batch, cout),
        f4::forward(&x, &weight, &d, batch, cout)
    );
    let grad = values(batch * cout * d.positions(), 9);
    let expected = crate::conv::flex::scattered_input_gradient(&weight, &grad, &d, batch, cout);
    let error = relative_error(&input_gradient(&weight, &grad, &d, batch, cout), &expected);
    assert!(error < TOLERANCE, "input gradient: {error}");
}
