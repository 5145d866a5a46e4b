//! The register tile of the direct convolution: 12 output positions (3 rows of 4 columns) ×
//! 32 output channels accumulated in 24 AVX-512 registers over every (input channel, tap) of
//! the kernel, reading the input in place.
//!
//! Each step of the inner loop loads two vectors of 16 weights and broadcasts 12 input values
//! straight from the padded image, then issues 24 fused multiply-adds: two vector loads and
//! twelve broadcasts per 24 FMAs keep the FMA units, not the loads, the limit. Nothing is
//! packed per tile (the weights are packed once per convolution), so, unlike im2col + GEMM,
//! the input is read where it lies instead of being copied twice.
//!
//! [`accumulate`] runs the AVX-512 version where the CPU has it ([`fast`]) and otherwise a
//! portable loop of the same sums (for tests; the dispatch takes this path only where it is
//! fast).

/// Output rows per tile.
pub(crate) const TILE_ROWS: usize = 3;
/// Output columns per tile row.
pub(crate) const TILE_COLUMNS: usize = 4;
/// Output channels per tile: two vectors of 16.
pub(crate) const TILE_CHANNELS: usize = 32;
/// Output positions per tile.
pub(crate) const TILE_POSITIONS: usize = TILE_ROWS * TILE_COLUMNS;

/// A tile's sums: `[position][channel]`, position `t·TILE_COLUMNS + c` for tile row `t` and
/// column `c`.
pub(crate) type Tile = [[f32; TILE_CHANNELS]; TILE_POSITIONS];

/// Whether this CPU runs the AVX-512 tile (the only one worth dispatching to).
pub(crate) fn fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Where a tile reads: row `t`, column `c`, step `k` reads
/// `input[rows[t] + taps[k] + c·STRIDE]`, against `weights[k·TILE_CHANNELS..][..TILE_CHANNELS]`.
pub(crate) struct TileSource<'a> {
    /// The padded input.
    pub input: &'a [f32],
    /// Offset of each tile row's first position (kernel tap 0).
    pub rows: [usize; TILE_ROWS],
    /// Offset of each (input channel, tap) step from a row's offset.
    pub taps: &'a [usize],
    /// The largest of `taps`.
    pub max_tap: usize,
    /// Packed weights: `taps.len()` steps of `TILE_CHANNELS` values.
    pub weights: &'a [f32],
}

/// `tile[t·4 + c][o] = Σ_k weights[k·32 + o] · input[rows[t] + taps[k] + c·STRIDE]`.
///
/// # Panics
///
/// If a read would fall outside `input` or `weights` (`max_tap` must bound `taps`).
pub(crate) fn accumulate<const STRIDE: usize>(source: &TileSource, tile: &mut Tile) {
    let last_row = source.rows.iter().copied().max().unwrap_or(0);
    let reach = last_row + source.max_tap + (TILE_COLUMNS - 1) * STRIDE;
    assert!(reach < source.input.len(), "direct tile: input too short");
    assert!(
        source.weights.len() >= source.taps.len() * TILE_CHANNELS,
        "direct tile: weights too short"
    );
    debug_assert!(source.taps.iter().all(|&t| t <= source.max_tap));
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: the CPU has AVX-512F (checked just above); every input offset is
        // `rows[t] + taps[k] + c·STRIDE ≤ reach < input.len()` (asserted, with `taps[k] ≤
        // max_tap` a precondition the caller states and debug builds check), every weight
        // offset below `taps.len()·TILE_CHANNELS ≤ weights.len()` (asserted).
        unsafe { accumulate_avx512::<STRIDE>(source, tile) };
        return;
    }
    accumulate_portable::<STRIDE>(source, tile);
}

/// The same sums in plain Rust, in the same order (without fusing, so rounding may differ).
pub(crate) fn accumulate_portable<const STRIDE: usize>(source: &TileSource, tile: &mut Tile) {
    *tile = [[0.0; TILE_CHANNELS]; TILE_POSITIONS];
    for (&tap, weights) in source
        .taps
        .iter()
        .zip(source.weights.chunks_exact(TILE_CHANNELS))
    {
        for (t, &row) in source.rows.iter().enumerate() {
            for c in 0..TILE_COLUMNS {
                let x = source.input[row + tap + c * STRIDE];
                for (sum, &w) in tile[t * TILE_COLUMNS + c].iter_mut().zip(weights) {
                    *sum += x * w;
                }
            }
        }
    }
}

/// # Safety
///
/// The CPU must have AVX-512F, and every offset `rows[t] + taps[k] + c·STRIDE` must lie
/// inside `input`, every `k·32 + 31` inside `weights`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_avx512<const STRIDE: usize>(source: &TileSource, tile: &mut Tile) {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
        _mm512_storeu_ps,
    };
    let input = source.input.as_ptr();
    let mut weights = source.weights.as_ptr();
    let mut sums: [[__m512; 2]; TILE_POSITIONS] = [[_mm512_setzero_ps(); 2]; TILE_POSITIONS];
    // SAFETY (all pointer reads below): within the bounds this function's contract states.
    unsafe {
        let rows = source.rows.map(|r| input.add(r));
        for &tap in source.taps {
            let low = _mm512_loadu_ps(weights);
            let high = _mm512_loadu_ps(weights.add(16));
            for (t, row) in rows.iter().enumerate() {
                let base = row.add(tap);
                for c in 0..TILE_COLUMNS {
                    let x = _mm512_set1_ps(*base.add(c * STRIDE));
                    let sum = &mut sums[t * TILE_COLUMNS + c];
                    sum[0] = _mm512_fmadd_ps(x, low, sum[0]);
                    sum[1] = _mm512_fmadd_ps(x, high, sum[1]);
                }
            }
            weights = weights.add(TILE_CHANNELS);
        }
        for (out, sum) in tile.iter_mut().zip(&sums) {
            _mm512_storeu_ps(out.as_mut_ptr(), sum[0]);
            _mm512_storeu_ps(out.as_mut_ptr().add(16), sum[1]);
        }
    }
}
