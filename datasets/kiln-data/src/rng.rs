//! Random generators derived from (seed, epoch, index), independent of which thread asks.

use rand::SeedableRng;
use rand::rngs::StdRng;

/// SplitMix64's finaliser: a bijective mix of 64 bits.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator for one (seed, stream, index) triple.
pub(crate) fn derived_rng(seed: u64, stream: u64, index: u64) -> StdRng {
    StdRng::seed_from_u64(mix(mix(mix(seed) ^ stream) ^ index))
}
