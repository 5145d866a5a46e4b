//! Zeroed output buffers, zeroed in parallel when large.
//!
//! `vec![0.0; n]` zeroes in the calling thread (calloc's memset once glibc serves large
//! blocks from its heap again), while the kernel that fills the buffer then runs on every
//! thread of the pool: on 2 threads that serial memset was about 3 % of a width-64 step's
//! busiest thread. Zeros in parallel cost the same bytes, split across the pool, each piece
//! one `memset`. The bytes are the cost: zeroing took about a tenth of the replica thread's
//! samples at width 16 on 2 threads, element by element through rayon or by `memset` alike,
//! so buffers a kernel writes in full skip it ([`collect_pieces`]).

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::simd::simd;

/// Below this many elements a serial fill is cheaper than splitting it.
const PARALLEL_ZEROS: usize = 1 << 16;

/// Elements each parallel piece zeroes (256 KiB).
const PIECE: usize = 1 << 16;

/// A vector of `len` zeros, written by the current rayon pool when `len` is large.
pub(crate) fn zeroed(len: usize) -> Vec<f32> {
    if len < PARALLEL_ZEROS {
        return vec![0.0; len];
    }
    let mut values: Vec<f32> = Vec::with_capacity(len);
    values.spare_capacity_mut()[..len]
        .par_chunks_mut(PIECE)
        .for_each(|piece| piece.fill(MaybeUninit::new(0.0)));
    // SAFETY: the capacity is at least `len` and the loop above initialised every one of
    // the first `len` elements (the chunks cover `[..len]`); `f32` has no drop glue.
    unsafe { values.set_len(len) };
    values
}

/// A vector of `len` values written once each, never zeroed first: piece `index` (values
/// `index·piece..`, the last piece possibly shorter) takes the values `values(index)` yields,
/// under the CPU's widest vectors (`simd`), the pieces in parallel.
///
/// For outputs every element of which a kernel computes (a normalised activation, a padded
/// copy): zeroing them first was a whole extra pass over memory, 4–9 % of a width-16 step.
///
/// # Panics
///
/// If a piece's iterator yields fewer values than the piece holds (extra values are
/// ignored), or if `piece` is 0.
pub(crate) fn collect_pieces<I, F>(len: usize, piece: usize, values: F) -> Vec<f32>
where
    I: Iterator<Item = f32>,
    F: Fn(usize) -> I + Sync,
{
    assert!(piece > 0, "collect_pieces: empty pieces");
    let mut out: Vec<f32> = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(piece)
        .enumerate()
        .for_each(|(index, slots)| {
            let written = simd(
                #[inline(always)]
                || {
                    let mut written = 0;
                    for (slot, value) in slots.iter_mut().zip(values(index)) {
                        slot.write(value);
                        written += 1;
                    }
                    written
                },
            );
            assert_eq!(written, slots.len(), "collect_pieces: a piece came short");
        });
    // SAFETY: the capacity is at least `len`; the pieces cover `[..len]` and each piece's
    // loop wrote every one of its slots (it wrote `written` slots in order from the first,
    // and a piece with fewer panicked above, so this line is not reached); `f32` has no
    // drop glue.
    unsafe { out.set_len(len) };
    out
}

#[cfg(test)]
mod tests {
    use super::{PARALLEL_ZEROS, collect_pieces, zeroed};

    #[test]
    fn collected_pieces_hold_every_value_in_place() {
        for (len, piece) in [(0, 4), (1, 4), (10, 4), (12, 4), (100_003, 4096)] {
            drop(std::hint::black_box(vec![1.5f32; len + 64]));
            let values = crate::test_support::in_pool(2, || {
                collect_pieces(len, piece, |index| {
                    (index * piece..).map(|i| i as f32).take(piece)
                })
            });
            let expected: Vec<f32> = (0..len).map(|i| i as f32).collect();
            assert_eq!(values, expected, "{len} in pieces of {piece}");
        }
    }

    #[test]
    #[should_panic(expected = "came short")]
    fn a_short_piece_panics_instead_of_leaving_values_unwritten() {
        // The last piece of 10 in pieces of 4 holds 2; every piece yields only 3.
        collect_pieces(10, 4, |index| (0..3).map(move |i| (index + i) as f32));
    }

    #[test]
    fn every_element_is_zero_at_every_size() {
        for len in [
            0,
            1,
            PARALLEL_ZEROS - 1,
            PARALLEL_ZEROS,
            3 * PARALLEL_ZEROS + 7,
        ] {
            // Memory just freed with other values in it, which the allocator tends to hand
            // back: every element must be written, not left as it was.
            drop(std::hint::black_box(vec![1.5f32; len + 64]));
            let values = crate::test_support::in_pool(2, || zeroed(len));
            assert_eq!(values.len(), len);
            assert!(values.iter().all(|&v| v == 0.0), "{len}");
        }
    }
}
