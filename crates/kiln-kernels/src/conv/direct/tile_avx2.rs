//! The direct tile on AVX2 (x86-64-v3: AMD Zen 1–3, Intel before AVX-512): the tile's sums
//! computed a register block at a time.
//!
//! AVX2 has 16 registers of 8 lanes, too few for the tile's 24 AVX-512 accumulators (48 of
//! AVX2's width). So the tile is swept in blocks of at most 6 positions × 16 channels: 12
//! accumulators, two weight vectors and one broadcast, the register budget of the usual
//! 6×16 AVX2 GEMM kernel. Each block runs over every step; per step it loads 2 operand
//! vectors and broadcasts 6 input values for 12 fused multiply-adds.

use crate::conv::direct::tile::{LANES, MAX_ACCUMULATORS, TileSource};

/// Most positions of one register block.
const BLOCK_POSITIONS: usize = 6;

/// [`crate::conv::direct::tile::accumulate`]'s sums with AVX2 and FMA.
///
/// # Safety
///
/// The CPU must have AVX2 and FMA; every offset `rows[t] + steps[k] + c·STRIDE` must lie
/// inside `input`, every `k·VECTORS·16 + VECTORS·16 − 1` inside `operand`; `tile` must hold
/// `ROWS·COLUMNS·VECTORS·16` values, with `ROWS·COLUMNS ≤ MAX_ACCUMULATORS`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn accumulate_avx2<
    const ROWS: usize,
    const COLUMNS: usize,
    const STRIDE: usize,
    const VECTORS: usize,
>(
    source: &TileSource<ROWS>,
    tile: &mut [f32],
) {
    let count = ROWS * COLUMNS;
    let width = VECTORS * LANES;
    let mut positions = [0usize; MAX_ACCUMULATORS];
    for (p, offset) in positions.iter_mut().enumerate().take(count) {
        *offset = source.rows[p / COLUMNS] + (p % COLUMNS) * STRIDE;
    }
    // Blocks of equal size (12 positions: 6 + 6; 8: 4 + 4), so none is a thin remainder.
    let blocks = count.div_ceil(BLOCK_POSITIONS);
    let per_block = count.div_ceil(blocks);
    let steps = source.steps.offsets();
    for first in (0..count).step_by(per_block) {
        let block = &positions[first..count.min(first + per_block)];
        for vector in 0..VECTORS {
            let operand = &source.operand[vector * LANES..];
            let out = &mut tile[first * width + vector * LANES..];
            // SAFETY: the caller's contract covers every read and write of the block: its
            // positions are the tile's, its operand columns `vector·16..+16` of each step's
            // `width`, its outputs those of the tile's positions `first..`.
            unsafe {
                match block.len() {
                    6 => block_sums::<6>(source.input, block, steps, operand, width, out),
                    5 => block_sums::<5>(source.input, block, steps, operand, width, out),
                    4 => block_sums::<4>(source.input, block, steps, operand, width, out),
                    3 => block_sums::<3>(source.input, block, steps, operand, width, out),
                    2 => block_sums::<2>(source.input, block, steps, operand, width, out),
                    _ => block_sums::<1>(source.input, block, steps, operand, width, out),
                }
            }
        }
    }
}

/// Adds to `out[p·width + o]` (`o < 16`, `p < N`) the sum over steps `k` of
/// `operand[k·width + o] · input[positions[p] + steps[k]]`.
///
/// # Safety
///
/// AVX2 and FMA; `positions` holds at least `N` offsets, each plus every step inside
/// `input`; `operand` holds `steps.len()` rows of `width` (the last may end after 16 values);
/// `out` holds `(N − 1)·width + 16` values.
#[target_feature(enable = "avx2,fma")]
unsafe fn block_sums<const N: usize>(
    input: &[f32],
    positions: &[usize],
    steps: &[usize],
    operand: &[f32],
    width: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::{
        __m256, _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    const HALF: usize = LANES / 2;
    let input = input.as_ptr();
    let operand = operand.as_ptr();
    let out = out.as_mut_ptr();
    // SAFETY: every pointer access below stays within the bounds of this function's
    // contract.
    unsafe {
        let bases: [*const f32; N] = std::array::from_fn(|p| input.add(positions[p]));
        let mut sums = [[_mm256_setzero_ps(); 2]; N];
        for (p, sum) in sums.iter_mut().enumerate() {
            sum[0] = _mm256_loadu_ps(out.add(p * width));
            sum[1] = _mm256_loadu_ps(out.add(p * width + HALF));
        }
        for (k, &step) in steps.iter().enumerate() {
            let values = operand.add(k * width);
            let low: __m256 = _mm256_loadu_ps(values);
            let high: __m256 = _mm256_loadu_ps(values.add(HALF));
            for (sum, base) in sums.iter_mut().zip(&bases) {
                let x = _mm256_broadcast_ss(&*base.add(step));
                sum[0] = _mm256_fmadd_ps(x, low, sum[0]);
                sum[1] = _mm256_fmadd_ps(x, high, sum[1]);
            }
        }
        for (p, sum) in sums.iter().enumerate() {
            _mm256_storeu_ps(out.add(p * width), sum[0]);
            _mm256_storeu_ps(out.add(p * width + HALF), sum[1]);
        }
    }
}
