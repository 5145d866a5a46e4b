//! Zeroed output buffers, zeroed in parallel when large.
//!
//! `vec![0.0; n]` zeroes in the calling thread (calloc's memset once glibc serves large
//! blocks from its heap again), while the kernel that fills the buffer then runs on every
//! thread of the pool: on 2 threads that serial memset was about 3 % of a width-64 step's
//! busiest thread. Zeros in parallel cost the same bytes, split across the pool.

use rayon::prelude::*;

/// Below this many elements a serial fill is cheaper than splitting it.
const PARALLEL_ZEROS: usize = 1 << 16;

/// A vector of `len` zeros, written by the current rayon pool when `len` is large.
pub(crate) fn zeroed(len: usize) -> Vec<f32> {
    if len < PARALLEL_ZEROS {
        return vec![0.0; len];
    }
    let mut values = Vec::with_capacity(len);
    values.par_extend(rayon::iter::repeat_n(0.0f32, len));
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
            let values = zeroed(len);
            assert_eq!(values.len(), len);
            assert!(values.iter().all(|&v| v == 0.0), "{len}");
        }
    }
}
