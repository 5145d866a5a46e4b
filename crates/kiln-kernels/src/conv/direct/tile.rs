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
//! [`accumulate`] runs the AVX-512 version where the CPU has it, the AVX2 one (register
//! blocks of the same tile, `direct/tile_avx2.rs`) on CPUs with AVX2 and FMA only ([`Isa`],
//! capped by `KILN_MAX_ISA`), and otherwise a portable loop of the same sums (for
//! tests; the dispatch takes the direct paths only where [`fast`]).

#[cfg(target_arch = "x86_64")]
use crate::conv::direct::tile_avx2::accumulate_avx2;
use crate::isa::Isa;

/// Output rows per forward tile.
pub(crate) const TILE_ROWS: usize = 3;
/// Output columns per forward tile row.
pub(crate) const TILE_COLUMNS: usize = 4;
/// Output channels per forward tile: two vectors of 16.
pub(crate) const TILE_CHANNELS: usize = 32;
/// Output positions per forward tile.
pub(crate) const TILE_POSITIONS: usize = TILE_ROWS * TILE_COLUMNS;
/// Lanes per vector.
pub(crate) const LANES: usize = 16;
/// Most accumulator registers a tile may use (of AVX-512's 32, the rest hold operands).
pub(crate) const MAX_ACCUMULATORS: usize = 24;

/// A forward tile's sums: `[position][channel]` flattened, position `t·TILE_COLUMNS + c` for
/// tile row `t` and column `c`.
pub(crate) type Tile = [f32; TILE_POSITIONS * TILE_CHANNELS];

/// Whether this CPU runs a vector tile (AVX-512, or AVX2 with FMA): the direct paths are
/// dispatched to only then.
pub(crate) fn fast() -> bool {
    Isa::current() > Isa::Portable
}

/// The offsets of a tile's steps, with a bound on them that every read the tile makes rests
/// on. Only [`Steps::new`] (the true largest offset) and [`Steps::part`] (its whole set's
/// bound) build one, so the bound is never below an offset: the vector tile's reads rest on
/// it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Steps<'a> {
    offsets: &'a [usize],
    largest: usize,
}

impl<'a> Steps<'a> {
    /// `offsets` and their largest (0 when empty).
    pub(crate) fn new(offsets: &'a [usize]) -> Self {
        let largest = offsets.iter().copied().max().unwrap_or(0);
        Self { offsets, largest }
    }

    /// The steps `range` of these, bounded by the whole set's largest offset (a bound of
    /// each of theirs, without a scan per tile).
    ///
    /// # Panics
    ///
    /// If `range` reaches past the steps.
    pub(crate) fn part(&self, range: std::ops::Range<usize>) -> Self {
        Self {
            offsets: &self.offsets[range],
            largest: self.largest,
        }
    }

    /// The offsets, in step order.
    pub(crate) fn offsets(&self) -> &'a [usize] {
        self.offsets
    }
}

/// Taps a tile leaves out because they read padding (zeros, which add nothing), for steps
/// that come in threes, one per kernel column of a 3-wide kernel (kernel column innermost):
/// with `first`, the tile's first column at the first step of each three (kernel column 0,
/// left of a tile at the left edge); with `last`, its last column at the third (kernel
/// column 2, right of a tile at the right edge). oneDNN's direct kernels leave these out too:
/// at a 4×4 output with padding 1 they are a sixth of the multiply-adds.
///
/// Leaving out a product of a zero changes no sum (a fused multiply-add of `+0·w` returns
/// the sum as it was, for finite `w`), so the AVX2 tile, which computes them, gives the same
/// results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ColumnSkip {
    /// Leave out the first column at steps `k ≡ 0 (mod 3)`.
    pub first: bool,
    /// Leave out the last column at steps `k ≡ 2 (mod 3)`.
    pub last: bool,
}

impl ColumnSkip {
    /// Every tap computed.
    pub(crate) const NONE: Self = Self {
        first: false,
        last: false,
    };

    /// Whether any tap is left out.
    pub(crate) fn any(self) -> bool {
        self.first || self.last
    }

    /// Whether column `column` of `columns` is computed at step `k`.
    fn computes(self, k: usize, column: usize, columns: usize) -> bool {
        !(self.first && k.is_multiple_of(3) && column == 0
            || self.last && k % 3 == 2 && column + 1 == columns)
    }
}

/// Where a tile reads: row `t`, column `c`, step `k` reads
/// `input[rows[t] + steps[k] + c·STRIDE]`, against the `VECTORS·16` values
/// `operand[k·VECTORS·16..]`. In the forward the steps are the kernel's (channel, tap) pairs
/// and the operand the packed weights; in the weight gradient the steps are output positions
/// and the operand the packed output gradient.
pub(crate) struct TileSource<'a, const ROWS: usize> {
    /// The padded input.
    pub input: &'a [f32],
    /// Offset of each tile row's first value.
    pub rows: [usize; ROWS],
    /// Offset of each step from a row's offset.
    pub steps: Steps<'a>,
    /// `steps` groups of `VECTORS·16` values.
    pub operand: &'a [f32],
    /// Taps left out as reading padding.
    pub skip: ColumnSkip,
}

/// `rows` (`width` rows of equal length, one after another) interleaved into `dst` as
/// `[length, width]`: the layout in which a tile reads its operand, `width` values per step.
/// A few columns at a time, so that `dst`'s lines stay in the L1 cache while every row is
/// written into them (one value per row per step, rows apart, cost 2–3 ms for 512-channel
/// weights).
///
/// # Panics
///
/// If `rows` and `dst` differ in length or that length is not a multiple of `width`.
pub(crate) fn interleave(rows: &[f32], width: usize, dst: &mut [f32]) {
    assert!(rows.len().is_multiple_of(width), "interleave: ragged rows");
    interleave_columns(rows, width, rows.len() / width, None, dst);
}

/// [`interleave`] taking the rows' columns in `order`: step `j` of `dst` holds column
/// `order[j]` of every row.
///
/// # Panics
///
/// If `rows` and `dst` differ in length, that length is not `width·order.len()`, or an entry
/// of `order` is not a column.
pub(crate) fn interleave_in_order(rows: &[f32], width: usize, order: &[usize], dst: &mut [f32]) {
    interleave_columns(rows, width, order.len(), Some(order), dst);
}

/// Steps `0..length` of `width` rows into `dst`, step `j` from column `order[j]` (column `j`
/// without an order).
fn interleave_columns(
    rows: &[f32],
    width: usize,
    length: usize,
    order: Option<&[usize]>,
    dst: &mut [f32],
) {
    const COLUMNS_AT_A_TIME: usize = 64;
    assert_eq!(rows.len(), dst.len(), "interleave: lengths differ");
    assert_eq!(rows.len(), width * length, "interleave: ragged rows");
    for first in (0..length).step_by(COLUMNS_AT_A_TIME) {
        let count = COLUMNS_AT_A_TIME.min(length - first);
        let part = &mut dst[first * width..][..count * width];
        for (lane, row) in rows.chunks_exact(length).enumerate() {
            let steps = part.chunks_exact_mut(width);
            match order {
                None => {
                    for (values, &v) in steps.zip(&row[first..first + count]) {
                        values[lane] = v;
                    }
                }
                Some(order) => {
                    for (values, &column) in steps.zip(&order[first..first + count]) {
                        values[lane] = row[column];
                    }
                }
            }
        }
    }
}

/// Adds to `tile[(t·COLUMNS + c)·W + o]` (`W = VECTORS·16`) the sum over steps `k` of
/// `operand[k·W + o] · input[rows[t] + steps[k] + c·STRIDE]`.
///
/// # Panics
///
/// If a read would fall outside `input` or `operand`, if
/// `tile` does not hold `ROWS·COLUMNS·W` values, if the tile needs more than
/// [`MAX_ACCUMULATORS`] registers or more than two vectors per position, or if the source
/// skips columns and its steps are not in threes.
pub(crate) fn accumulate<
    const ROWS: usize,
    const COLUMNS: usize,
    const STRIDE: usize,
    const VECTORS: usize,
>(
    source: &TileSource<ROWS>,
    tile: &mut [f32],
) {
    accumulate_on::<ROWS, COLUMNS, STRIDE, VECTORS>(Isa::current(), source, tile);
}

/// [`accumulate`] on a given instruction set.
///
/// # Panics
///
/// As [`accumulate`]; also if the CPU lacks `isa`.
pub(crate) fn accumulate_on<
    const ROWS: usize,
    const COLUMNS: usize,
    const STRIDE: usize,
    const VECTORS: usize,
>(
    isa: Isa,
    source: &TileSource<ROWS>,
    tile: &mut [f32],
) {
    assert!(
        (1..=2).contains(&VECTORS) && ROWS * COLUMNS * VECTORS <= MAX_ACCUMULATORS,
        "direct tile: too many accumulators"
    );
    assert_eq!(
        tile.len(),
        ROWS * COLUMNS * VECTORS * LANES,
        "direct tile: size"
    );
    let last_row = source.rows.iter().copied().max().unwrap_or(0);
    let reach = last_row + source.steps.largest + (COLUMNS - 1) * STRIDE;
    assert!(reach < source.input.len(), "direct tile: input too short");
    assert!(
        source.operand.len() >= source.steps.offsets.len() * VECTORS * LANES,
        "direct tile: operand too short"
    );
    assert!(isa <= Isa::detected(), "direct tile: the CPU lacks {isa:?}");
    assert!(
        !source.skip.any() || source.steps.offsets.len().is_multiple_of(3),
        "direct tile: column skips need steps in threes"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F (asserted); every input offset is
        // `rows[t] + steps[k] + c·STRIDE ≤ reach < input.len()` (asserted;
        // `Steps` holds a bound of its offsets, by construction), every operand
        // offset below `steps.len()·VECTORS·16 ≤ operand.len()` and every tile offset below
        // `tile.len()` (asserted), and the accumulators fit their array (asserted).
        Isa::Avx512 => unsafe {
            match (source.skip.first, source.skip.last) {
                (false, false) => {
                    accumulate_avx512::<ROWS, COLUMNS, STRIDE, VECTORS, false, false>(source, tile)
                }
                (true, false) => {
                    accumulate_avx512::<ROWS, COLUMNS, STRIDE, VECTORS, true, false>(source, tile)
                }
                (false, true) => {
                    accumulate_avx512::<ROWS, COLUMNS, STRIDE, VECTORS, false, true>(source, tile)
                }
                (true, true) => {
                    accumulate_avx512::<ROWS, COLUMNS, STRIDE, VECTORS, true, true>(source, tile)
                }
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2 and FMA (asserted); the bounds as for AVX-512 above. It
        // computes the skipped taps (products of padding zeros: the same sums).
        Isa::Avx2 => unsafe { accumulate_avx2::<ROWS, COLUMNS, STRIDE, VECTORS>(source, tile) },
        _ => accumulate_portable::<ROWS, COLUMNS, STRIDE, VECTORS>(source, tile),
    }
}

/// The same sums in plain Rust, in the same order (without fusing, so rounding may differ),
/// leaving out the same taps.
pub(crate) fn accumulate_portable<
    const ROWS: usize,
    const COLUMNS: usize,
    const STRIDE: usize,
    const VECTORS: usize,
>(
    source: &TileSource<ROWS>,
    tile: &mut [f32],
) {
    let width = VECTORS * LANES;
    for (k, (&step, operand)) in source
        .steps
        .offsets
        .iter()
        .zip(source.operand.chunks_exact(width))
        .enumerate()
    {
        for (t, &row) in source.rows.iter().enumerate() {
            for c in (0..COLUMNS).filter(|&c| source.skip.computes(k, c, COLUMNS)) {
                let x = source.input[row + step + c * STRIDE];
                let sums = &mut tile[(t * COLUMNS + c) * width..][..width];
                for (sum, &w) in sums.iter_mut().zip(operand) {
                    *sum += x * w;
                }
            }
        }
    }
}

/// # Safety
///
/// The CPU must have AVX-512F; every offset `rows[t] + steps[k] + c·STRIDE` must lie inside
/// `input`, every `k·VECTORS·16 + VECTORS·16 − 1` inside `operand`; `tile` must hold
/// `ROWS·COLUMNS·VECTORS·16` values, with `ROWS·COLUMNS·VECTORS ≤ MAX_ACCUMULATORS` and
/// `VECTORS ≤ 2`. `SKIP_FIRST` and `SKIP_LAST` are `source.skip`'s (the steps in threes when
/// either is set; a remainder is left out).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_avx512<
    const ROWS: usize,
    const COLUMNS: usize,
    const STRIDE: usize,
    const VECTORS: usize,
    const SKIP_FIRST: bool,
    const SKIP_LAST: bool,
>(
    source: &TileSource<ROWS>,
    tile: &mut [f32],
) {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
        _mm512_storeu_ps,
    };
    let width = VECTORS * LANES;
    let input = source.input.as_ptr();
    let mut operand = source.operand.as_ptr();
    let out = tile.as_mut_ptr();
    // SAFETY: every pointer access below stays within the bounds this function's contract
    // states.
    unsafe {
        let mut sums: [[__m512; 2]; MAX_ACCUMULATORS] =
            [[_mm512_setzero_ps(); 2]; MAX_ACCUMULATORS];
        for (p, sum) in sums.iter_mut().enumerate().take(ROWS * COLUMNS) {
            for (v, lane) in sum.iter_mut().enumerate().take(VECTORS) {
                *lane = _mm512_loadu_ps(out.add(p * width + v * LANES));
            }
        }
        let rows = source.rows.map(|r| input.add(r));
        // One step over tile columns `$first..$end` (constants, so that the loops unroll and
        // the sums stay in registers).
        macro_rules! step {
            ($step:expr, $first:expr, $end:expr) => {{
                let mut vectors = [_mm512_setzero_ps(); 2];
                vectors[0] = _mm512_loadu_ps(operand);
                if VECTORS == 2 {
                    vectors[1] = _mm512_loadu_ps(operand.add(LANES));
                }
                for (t, row) in rows.iter().enumerate() {
                    let base = row.add($step);
                    for c in $first..$end {
                        let x = _mm512_set1_ps(*base.add(c * STRIDE));
                        let sum = &mut sums[t * COLUMNS + c];
                        for v in 0..VECTORS {
                            sum[v] = _mm512_fmadd_ps(x, vectors[v], sum[v]);
                        }
                    }
                }
                operand = operand.add(width);
            }};
        }
        if SKIP_FIRST || SKIP_LAST {
            let (threes, _) = source.steps.offsets.as_chunks::<3>();
            for &[left, middle, right] in threes {
                step!(left, usize::from(SKIP_FIRST), COLUMNS);
                step!(middle, 0, COLUMNS);
                step!(right, 0, COLUMNS - usize::from(SKIP_LAST));
            }
        } else {
            for &step in source.steps.offsets {
                step!(step, 0, COLUMNS);
            }
        }
        for (p, sum) in sums.iter().enumerate().take(ROWS * COLUMNS) {
            for (v, lane) in sum.iter().enumerate().take(VECTORS) {
                _mm512_storeu_ps(out.add(p * width + v * LANES), *lane);
            }
        }
    }
}
