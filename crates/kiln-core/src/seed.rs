//! Deterministic seeding of Burn's random generator.
//!
//! Burn's CPU backend keeps one process-wide random generator, so two threads that seed it
//! and then draw (say, two tests initialising models) interleave and lose determinism.
//! [`with_seed`] holds a process-wide lock across "seed, then draw", which makes model
//! initialisation reproducible as long as every seeded draw goes through it.

use burn::tensor::Device;
use std::sync::Mutex;

static SEED_LOCK: Mutex<()> = Mutex::new(());

/// Seeds `device`'s generator with `seed` and runs `init` while no other `with_seed` call runs.
///
/// ```
/// use burn::tensor::{Device, Distribution, Tensor};
/// let device = Device::flex();
/// let a = kiln_core::with_seed(&device, 7, || Tensor::<1>::random([4], Distribution::Default, &device));
/// let b = kiln_core::with_seed(&device, 7, || Tensor::<1>::random([4], Distribution::Default, &device));
/// assert_eq!(a.into_data(), b.into_data());
/// ```
pub fn with_seed<T>(device: &Device, seed: u64, init: impl FnOnce() -> T) -> T {
    // A panic while holding the lock leaves nothing inconsistent behind: the generator is
    // re-seeded by the next caller anyway.
    let _guard = SEED_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    device.seed(seed);
    init()
}
