//! Zeroed output buffers, zeroed in parallel when large.
//!
//! `vec![0.0; n]` zeroes in the calling thread (calloc's memset once glibc serves large
//! blocks from its heap again), while the kernel that fills the buffer then runs on every
//! thread of the pool: on 2 threads that serial memset was about 3 % of a width-64 step's
//! busiest thread. Zeros in parallel cost the same bytes, split across the pool, each piece
//! one `memset`. (An earlier version collected `repeat_n(0.0)` through rayon's `par_extend`,
//! one element at a time: a scalar loop that took about 11 % of a width-16 step.)

use std::mem::MaybeUninit;

use rayon::prelude::*;

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

#[cfg(test)]
mod tests {
    use super::{PARALLEL_ZEROS, zeroed};

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
