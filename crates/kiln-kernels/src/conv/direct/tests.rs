//! The direct convolution against im2col (the reference the convolution tests hold to Burn).

use crate::conv::dims::ConvDims;
use crate::conv::direct;
use crate::conv::direct::tile::{
    self, ColumnSkip, Steps, TILE_CHANNELS, TILE_COLUMNS, TILE_POSITIONS, TILE_ROWS, Tile,
    TileSource,
};
use crate::conv::flex::{im2col_forward, im2col_weight_gradient};
use crate::conv::geometry::ConvGeometry;
use crate::isa::Isa;
use crate::test_support::{conv_dims as dims, in_pool, relative_error, values};

/// (dims, out channels, batch): shapes the direct kernel fits, with partial last pieces
/// (batches not a multiple of 3, heights not of 3), strides 1 and 2, asymmetric padding,
/// dilation and 1×1 kernels; small planes (whose tiles skip kernel rows over padding) with
/// partial channel blocks.
fn cases() -> Vec<(ConvDims, usize, usize)> {
    let g = ConvGeometry::new;
    let same = || g().with_padding([(1, 1), (1, 1)]);
    vec![
        (dims(16, [8, 8], [3, 3], same()), 32, 5),
        (dims(40, [4, 4], [3, 3], same()), 64, 4),
        (dims(3, [16, 16], [3, 3], same()), 32, 2),
        (
            dims(24, [16, 16], [3, 3], same().with_stride([2, 2])),
            32,
            3,
        ),
        (dims(16, [16, 8], [1, 1], g().with_stride([2, 2])), 96, 7),
        (
            dims(8, [7, 12], [3, 3], g().with_padding([(2, 0), (1, 1)])),
            32,
            2,
        ),
        (
            dims(
                8,
                [10, 12],
                [3, 3],
                g().with_dilation([2, 2]).with_padding([(2, 2), (2, 2)]),
            ),
            32,
            1,
        ),
        (
            dims(8, [5, 8], [5, 3], g().with_padding([(2, 2), (1, 1)])),
            32,
            4,
        ),
        (
            dims(
                6,
                [6, 8],
                [3, 3],
                g().with_dilation([2, 2]).with_padding([(2, 1), (2, 2)]),
            ),
            32,
            5,
        ),
    ]
}

#[test]
fn direct_forward_equals_im2col() {
    for (index, (d, out_channels, batch)) in cases().into_iter().enumerate() {
        assert!(
            direct::forward::shape_fits(&d, out_channels),
            "case {index}"
        );
        let x = values(batch * d.image_len(), 1 + index as u64);
        let weight = values(out_channels * d.rows(), 50 + index as u64);
        let direct = direct::forward::forward(&x, &weight, &d, batch, out_channels);
        let reference = im2col_forward(&x, &weight, &d, batch, out_channels);
        let error = relative_error(&direct, &reference);
        assert!(error < 1e-5, "case {index}: relative error {error}");
        // Control: a weight changed by 1 % of its range shows.
        let mut changed = weight.clone();
        changed[weight.len() / 2] += 0.02;
        let other = im2col_forward(&x, &changed, &d, batch, out_channels);
        assert!(
            relative_error(&direct, &other) > 1e-4,
            "case {index}: control"
        );
    }
}

#[test]
fn direct_forward_does_not_depend_on_the_thread_count() {
    for (d, out_channels, batch) in cases().into_iter().take(5) {
        let x = values(batch * d.image_len(), 7);
        let weight = values(out_channels * d.rows(), 8);
        let run = |threads| {
            in_pool(threads, || {
                direct::forward::forward(&x, &weight, &d, batch, out_channels)
            })
        };
        assert_eq!(run(1), run(3));
    }
}

#[test]
fn shapes_the_tile_cannot_cover_are_refused() {
    let g = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
    assert!(!direct::forward::shape_fits(
        &dims(8, [8, 8], [3, 3], g),
        16
    ));
    assert!(!direct::forward::shape_fits(
        &dims(8, [6, 6], [3, 3], g),
        32
    ));
    let strided = g.with_stride([3, 3]);
    assert!(!direct::forward::shape_fits(
        &dims(8, [24, 24], [3, 3], strided),
        32
    ));
    let uneven = g.with_stride([1, 2]);
    assert!(!direct::forward::shape_fits(
        &dims(8, [16, 16], [3, 3], uneven),
        32
    ));
}

/// (dims, out channels, batch) for the weight gradient: 16- and 32-channel tiles, 3- and
/// 1-wide kernels, strides 1 and 2, pair counts that leave a partial last tile.
fn weight_gradient_cases() -> Vec<(ConvDims, usize, usize)> {
    let g = ConvGeometry::new;
    let same = || g().with_padding([(1, 1), (1, 1)]);
    vec![
        (dims(16, [8, 8], [3, 3], same()), 32, 5),
        (dims(5, [12, 12], [3, 3], same()), 16, 3),
        (dims(3, [16, 16], [3, 3], same()), 48, 2),
        (
            dims(24, [16, 16], [3, 3], same().with_stride([2, 2])),
            32,
            3,
        ),
        (dims(16, [16, 8], [1, 1], g().with_stride([2, 2])), 96, 7),
        (dims(7, [9, 9], [1, 1], g()), 16, 2),
        (
            dims(4, [7, 11], [5, 3], g().with_padding([(2, 0), (1, 1)])),
            32,
            2,
        ),
        (dims(8, [40, 40], [3, 3], same()), 16, 1),
        // Two images per chunk of positions, three images: a last chunk of one.
        (dims(32, [16, 16], [3, 3], same()), 32, 3),
    ]
}

#[test]
fn direct_weight_gradient_equals_im2col() {
    for (index, (d, out_channels, batch)) in weight_gradient_cases().into_iter().enumerate() {
        assert!(
            direct::weight_gradient::shape_fits(&d, out_channels),
            "case {index}"
        );
        let x = values(batch * d.image_len(), 3 + index as u64);
        let grad = values(batch * out_channels * d.positions(), 70 + index as u64);
        let direct = direct::weight_gradient::weight_gradient(&x, &grad, &d, batch, out_channels);
        let reference = im2col_weight_gradient(&x, &grad, &d, batch, out_channels);
        let error = relative_error(&direct, &reference);
        assert!(error < 1e-5, "case {index}: relative error {error}");
        // Control: one output-gradient value changed shows in the weight gradient.
        let mut changed = grad.clone();
        changed[grad.len() / 3] += 0.5;
        let other = im2col_weight_gradient(&x, &changed, &d, batch, out_channels);
        assert!(
            relative_error(&direct, &other) > 1e-4,
            "case {index}: control"
        );
    }
}

#[test]
fn direct_weight_gradient_does_not_depend_on_the_thread_count() {
    for (d, out_channels, batch) in weight_gradient_cases() {
        let x = values(batch * d.image_len(), 9);
        let grad = values(batch * out_channels * d.positions(), 10);
        let run = |threads| {
            in_pool(threads, || {
                direct::weight_gradient::weight_gradient(&x, &grad, &d, batch, out_channels)
            })
        };
        assert_eq!(run(1), run(3));
    }
}

#[test]
fn weight_gradient_shapes_the_tile_cannot_cover_are_refused() {
    let g = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
    assert!(!direct::weight_gradient::shape_fits(
        &dims(8, [8, 8], [3, 3], g),
        8
    ));
    assert!(!direct::weight_gradient::shape_fits(
        &dims(8, [8, 8], [3, 5], g),
        32
    ));
    let dilated = g.with_dilation([2, 2]);
    assert!(!direct::weight_gradient::shape_fits(
        &dims(8, [8, 8], [3, 3], dilated),
        32
    ));
}

#[test]
fn the_vector_tile_equals_the_portable_one() {
    // Exact inputs (small whole numbers): both orders of rounding give the same sums.
    let input: Vec<f32> = (0..4000).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let taps: Vec<usize> = (0..37).map(|k| k * 13 % 300).collect();
    let weights: Vec<f32> = (0..taps.len() * TILE_CHANNELS)
        .map(|i| ((i * 5) % 9) as f32 - 4.0)
        .collect();
    let source = TileSource {
        input: &input,
        rows: [0, 1000, 2500],
        steps: Steps::new(&taps),
        operand: &weights,
        skip: ColumnSkip::NONE,
    };
    // Sums are added to what the tile holds.
    let start: Tile = std::array::from_fn(|i| (i % 3) as f32);
    let (mut fast, mut portable) = (start, start);
    tile::accumulate::<TILE_ROWS, TILE_COLUMNS, 2, 2>(&source, &mut fast);
    tile::accumulate_portable::<TILE_ROWS, TILE_COLUMNS, 2, 2>(&source, &mut portable);
    assert_eq!(fast, portable);
    assert_ne!(portable, start);
    // Stride 1 reads other values.
    let mut unit = start;
    tile::accumulate::<TILE_ROWS, TILE_COLUMNS, 1, 2>(&source, &mut unit);
    assert_ne!(unit, fast);
    // One vector of 16 channels, 24 positions (the narrow weight gradient's tile).
    let rows: [usize; 8] = std::array::from_fn(|r| r * 300);
    let narrow = TileSource {
        input: &input,
        rows,
        steps: Steps::new(&taps),
        operand: &weights[..taps.len() * 16],
        skip: ColumnSkip::NONE,
    };
    let (mut fast, mut portable) = (vec![1.0; 24 * 16], vec![1.0; 24 * 16]);
    tile::accumulate::<8, 3, 1, 1>(&narrow, &mut fast);
    tile::accumulate_portable::<8, 3, 1, 1>(&narrow, &mut portable);
    assert_eq!(fast, portable);
}

/// Every vector tile this CPU has, in every shape the kernels use, against the portable
/// sums (exact inputs) and against each other (inexact inputs: AVX2's register blocks sum
/// each output in the AVX-512 tile's order, so the two agree bit for bit).
#[test]
fn every_instruction_set_computes_the_same_tile() {
    let isas: Vec<Isa> = [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|isa| *isa <= Isa::detected())
        .collect();
    eprintln!("tiles checked: {isas:?}");
    let exact: Vec<f32> = (0..4000).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let inexact = values(4000, 17);
    let taps: Vec<usize> = (0..37).map(|k| k * 13 % 300).collect();
    let operand_exact: Vec<f32> = (0..taps.len() * 32)
        .map(|i| ((i * 5) % 9) as f32 - 4.0)
        .collect();
    let operand_inexact = values(taps.len() * 32, 18);
    fn sums<const R: usize, const C: usize, const V: usize>(
        isa: Isa,
        input: &[f32],
        operand: &[f32],
        taps: &[usize],
    ) -> Vec<f32> {
        let source = TileSource {
            input,
            rows: std::array::from_fn(|r| r * 290 + r % 2),
            steps: Steps::new(taps),
            operand: &operand[..taps.len() * V * 16],
            skip: ColumnSkip::NONE,
        };
        let mut tile: Vec<f32> = (0..R * C * V * 16).map(|i| (i % 5) as f32).collect();
        tile::accumulate_on::<R, C, 2, V>(isa, &source, &mut tile);
        tile
    }
    macro_rules! check {
        ($r:literal, $c:literal, $v:literal) => {
            let portable = sums::<$r, $c, $v>(Isa::Portable, &exact, &operand_exact, &taps);
            let reference =
                sums::<$r, $c, $v>(isas[isas.len() - 1], &inexact, &operand_inexact, &taps);
            for &isa in &isas {
                let shape = format!("{isa:?} {}×{}×{}", $r, $c, $v);
                assert_eq!(
                    sums::<$r, $c, $v>(isa, &exact, &operand_exact, &taps),
                    portable,
                    "{shape}"
                );
                if isa > Isa::Portable {
                    let got = sums::<$r, $c, $v>(isa, &inexact, &operand_inexact, &taps);
                    assert_eq!(got, reference, "{shape}");
                }
            }
        };
    }
    // The forward's tile and the weight gradient's four.
    check!(3, 4, 2);
    check!(4, 3, 2);
    check!(8, 3, 1);
    check!(8, 1, 2);
    check!(12, 1, 1);
    // Control: the inexact inputs do round differently unfused.
    let portable = sums::<3, 4, 2>(Isa::Portable, &inexact, &operand_inexact, &taps);
    if isas.len() > 1 {
        assert_ne!(
            portable,
            sums::<3, 4, 2>(isas[1], &inexact, &operand_inexact, &taps)
        );
    }
}

/// The taps a [`ColumnSkip`] names are left out: the input they would read holds NaN, and the
/// sums equal those over an input with zeros there. The AVX2 tile computes them (products of
/// the zeros padding holds: the same sums).
#[test]
fn skipped_columns_read_nothing() {
    let isas: Vec<Isa> = [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|isa| *isa <= Isa::detected())
        .collect();
    // Threes of steps 40 apart: a three's skipped reads (its first step's column 0, its
    // third's column 3) are read by no other step or column.
    let taps: Vec<usize> = (0..12)
        .flat_map(|g| [40 * g, 40 * g + 10, 40 * g + 20])
        .collect();
    let rows = [0, 1000, 2500];
    let weights: Vec<f32> = (0..taps.len() * TILE_CHANNELS)
        .map(|i| ((i * 5) % 9) as f32 - 4.0)
        .collect();
    let clean: Vec<f32> = (0..3000).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    for skip in
        [(true, false), (false, true), (true, true)].map(|(first, last)| ColumnSkip { first, last })
    {
        let (mut zeros, mut poisoned) = (clean.clone(), clean.clone());
        for row in rows {
            for (k, &tap) in taps.iter().enumerate() {
                let column = match k % 3 {
                    0 if skip.first => 0,
                    2 if skip.last => TILE_COLUMNS - 1,
                    _ => continue,
                };
                zeros[row + tap + column] = 0.0;
                poisoned[row + tap + column] = f32::NAN;
            }
        }
        let sums = |isa: Isa, input: &[f32], skip: ColumnSkip| {
            let source = TileSource {
                input,
                rows,
                steps: Steps::new(&taps),
                operand: &weights,
                skip,
            };
            let mut tile: Tile = [1.0; TILE_POSITIONS * TILE_CHANNELS];
            tile::accumulate_on::<TILE_ROWS, TILE_COLUMNS, 1, 2>(isa, &source, &mut tile);
            tile
        };
        let expected = sums(Isa::Portable, &zeros, ColumnSkip::NONE);
        for &isa in &isas {
            assert_eq!(sums(isa, &zeros, skip), expected, "{isa:?} {skip:?}");
            if isa != Isa::Avx2 {
                assert_eq!(sums(isa, &poisoned, skip), expected, "{isa:?} {skip:?}");
            }
            // Control: without the skip, the poisoned reads reach the sums.
            assert!(
                sums(isa, &poisoned, ColumnSkip::NONE)
                    .iter()
                    .any(|v| v.is_nan())
            );
        }
    }
}

#[test]
#[should_panic(expected = "input too short")]
fn a_tile_reaching_past_its_input_panics() {
    let input = vec![0.0; 100];
    let weights = vec![0.0; TILE_CHANNELS];
    let source = TileSource {
        input: &input,
        rows: [0, 0, 95],
        steps: Steps::new(&[2]),
        operand: &weights,
        skip: ColumnSkip::NONE,
    };
    let mut tile: Tile = [0.0; TILE_POSITIONS * TILE_CHANNELS];
    tile::accumulate::<TILE_ROWS, TILE_COLUMNS, 1, 2>(&source, &mut tile);
}

/// The dispatch takes the direct paths where they were measured fastest (on CPUs with
/// AVX-512) and keeps them off where they were not.
#[test]
fn the_dispatch_takes_the_direct_paths_where_they_were_fastest() {
    use crate::conv::flex::{forward_values, weight_gradient};
    let g = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
    let batch = 3;
    let run = |channels: usize, size: usize, geometry: ConvGeometry| {
        let d = dims(channels, [size, size], [3, 3], geometry);
        let x = values(batch * d.image_len(), 1);
        let weight = values(channels * d.rows(), 2);
        let grad = values(batch * channels * d.positions(), 3);
        let forward = forward_values(&x, &weight, &d, batch, channels);
        let direct_forward = direct::forward::forward(&x, &weight, &d, batch, channels);
        let wgrad = weight_gradient(&x, &grad, &d, batch, channels);
        let direct_wgrad = direct::weight_gradient::weight_gradient(&x, &grad, &d, batch, channels);
        (forward == direct_forward, wgrad == direct_wgrad)
    };
    let fast = tile::fast();
    // 64 channels on 8×8, 32 on 16×16, strided 3×3: both directions direct (the forward
    // at 64 channels 8×8 only with AVX-512; F(2×2) on AVX2).
    let avx512 = Isa::current() == Isa::Avx512;
    assert_eq!(run(64, 8, g), (avx512, fast));
    assert_eq!(run(32, 16, g), (fast, fast));
    assert_eq!(run(32, 16, g.with_stride([2, 2])), (fast, fast));
    // 128 channels on 16×16: F(4×4) forward, F(2×2) weight gradient.
    assert_eq!(run(128, 16, g), (false, false));
    // 512 channels on 4×4 (past the kernel volume for larger planes): the forward direct
    // with AVX-512 (it skips the taps over padding on every edge).
    assert_eq!(run(512, 4, g).0, avx512);
    // 256 channels on 8×8: F(2×2) forward.
    assert!(!run(256, 8, g).0);
}

/// Batches of 1 to 5 images on planes from 4×4 to 20×20, strides 1 and 2, 3×3 and 1×1
/// kernels: every partial piece and chunk the loops can leave.
#[test]
fn direct_paths_equal_im2col_over_a_sweep_of_batches_and_sizes() {
    let g = ConvGeometry::new;
    for batch in 1..=5 {
        for size in [4, 8, 12, 20] {
            for stride in [1, 2] {
                for (kernel, pad) in [(3, 1), (1, 0)] {
                    let d = dims(
                        8,
                        [size, size],
                        [kernel, kernel],
                        g().with_stride([stride, stride])
                            .with_padding([(pad, pad), (pad, pad)]),
                    );
                    let case =
                        format!("batch {batch}, {size}×{size}, stride {stride}, {kernel}×{kernel}");
                    let x = values(batch * d.image_len(), batch as u64);
                    let grad = values(batch * 32 * d.positions(), 9);
                    let wgrad = direct::weight_gradient::weight_gradient(&x, &grad, &d, batch, 32);
                    let reference = im2col_weight_gradient(&x, &grad, &d, batch, 32);
                    assert!(
                        relative_error(&wgrad, &reference) < 1e-5,
                        "{case}: weight gradient"
                    );
                    if direct::forward::shape_fits(&d, 32) {
                        let weight = values(32 * d.rows(), 4);
                        let out = direct::forward::forward(&x, &weight, &d, batch, 32);
                        let reference = im2col_forward(&x, &weight, &d, batch, 32);
                        assert!(relative_error(&out, &reference) < 1e-5, "{case}: forward");
                    }
                }
            }
        }
    }
}
