//! The lowest and the highest of one whole number over every rank, exactly: the check that
//! every rank resumes the same step. The collectives carry f32, which holds whole numbers
//! exactly only below 2^24, so the number travels in 24-bit digits, most significant first,
//! and each round only the ranks still tied for the extreme offer their next digit.

use crate::{CommError, Communicator, ReduceOp};

/// Bits per digit: an f32 holds every whole number below 2^24 exactly.
const DIGIT_BITS: u32 = 24;
/// Digits of a u64 (the first holds its top 16 bits).
const DIGITS: u32 = u64::BITS.div_ceil(DIGIT_BITS);
/// Offered by a rank no longer tied for the highest: below every digit.
const OUT_OF_MAX: f32 = -1.0;
/// Offered (negated digits) by a rank no longer tied for the lowest: below every negated digit.
const OUT_OF_MIN: f32 = -((1u32 << DIGIT_BITS) as f32);

impl Communicator {
    /// The lowest and the highest `value` over all ranks, every rank getting both: equal
    /// when every rank holds the same value. Exact for every `u64`, in three all-reduces.
    ///
    /// ```
    /// let comms = kiln_comm::InProcessGroup::new(2).build();
    /// let ranges: Vec<(u64, u64)> = std::thread::scope(|scope| {
    ///     let handles: Vec<_> = comms
    ///         .into_iter()
    ///         .map(|comm| scope.spawn(move || comm.value_range(10 + comm.rank() as u64)))
    ///         .collect();
    ///     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()
    /// })?;
    /// assert_eq!(ranges, vec![(10, 11), (10, 11)]);
    /// # Ok::<(), kiln_comm::CommError>(())
    /// ```
    ///
    /// # Errors
    /// The all-reduce's: a peer lost, or the timeout passed.
    pub fn value_range(&self, value: u64) -> Result<(u64, u64), CommError> {
        let (mut lowest, mut highest) = (0u64, 0u64);
        let (mut tied_low, mut tied_high) = (true, true);
        for index in (0..DIGITS).rev() {
            let digit = (value >> (index * DIGIT_BITS)) & ((1 << DIGIT_BITS) - 1);
            let mut offers = [
                if tied_high { digit as f32 } else { OUT_OF_MAX },
                if tied_low {
                    -(digit as f32)
                } else {
                    OUT_OF_MIN
                },
            ];
            self.all_reduce(&mut offers, ReduceOp::Max)?;
            // Some rank is always still tied for each extreme: both are real digits.
            let (high, low) = (offers[0] as u64, (-offers[1]) as u64);
            tied_high &= digit == high;
            tied_low &= digit == low;
            highest = (highest << DIGIT_BITS) | high;
            lowest = (lowest << DIGIT_BITS) | low;
        }
        Ok((lowest, highest))
    }
}

#[cfg(test)]
mod tests {
    use crate::InProcessGroup;

    /// Each rank's range over `values` (one value per rank).
    fn ranges(values: &[u64]) -> Vec<(u64, u64)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = InProcessGroup::new(values.len())
                .timeout(std::time::Duration::from_secs(20))
                .build()
                .into_iter()
                .map(|comm| scope.spawn(move || comm.value_range(values[comm.rank()]).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Values that differ only beyond f32's 24 exact bits, and in every digit, come back
    /// exact on every rank; equal values give an empty range.
    #[test]
    fn value_range_is_exact_beyond_f32s_precision() {
        let cases: [(&[u64], (u64, u64)); 5] = [
            (&[7, 7, 7], (7, 7)),
            (
                &[(1 << 40) + 3, (1 << 40) + 1, 1 << 40],
                (1 << 40, (1 << 40) + 3),
            ),
            (&[16_777_217, 16_777_216], (16_777_216, 16_777_217)),
            (&[u64::MAX, 0, 1 << 63], (0, u64::MAX)),
            // The highest's top digit is the lowest's too: the lower digits must decide.
            (
                &[(5 << 48) | 9, (5 << 48) | 2, (4 << 48) | 0xff_ffff],
                ((4 << 48) | 0xff_ffff, (5 << 48) | 9),
            ),
        ];
        for (values, expected) in cases {
            for (rank, range) in ranges(values).into_iter().enumerate() {
                assert_eq!(range, expected, "rank {rank} of {values:?}");
            }
        }
    }
}
