//! Deterministic seeding of Burn's random generator.
//!
//! Burn's CPU backend keeps one process-wide random generator, so two threads that seed it
//! and then draw (say, two tests initialising models) interleave and lose determinism.
//! [`with_seed`] holds a process-wide lock across "seed, then draw", which makes model
//! initialisation reproducible as long as every seeded draw goes through it.
//!
//! Burn initialises parameters lazily, on first use: a model built inside `with_seed` but
//! first used outside it would draw its weights later, from whatever state the generator is
//! in then. [`init_module`] therefore materialises every parameter before releasing the lock.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor};
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

/// Builds a module with `init` from `seed`, materialising every lazily initialised
/// parameter before returning, so the weights depend on `seed` alone.
///
/// ```
/// use burn::nn::LinearConfig;
/// use burn::tensor::Device;
/// let device = Device::flex();
/// let a = kiln_core::init_module(&device, 3, || LinearConfig::new(4, 2).init(&device));
/// let b = kiln_core::init_module(&device, 3, || LinearConfig::new(4, 2).init(&device));
/// assert_eq!(a.weight.val().into_data(), b.weight.val().into_data());
/// ```
pub fn init_module<M: Module>(device: &Device, seed: u64, init: impl FnOnce() -> M) -> M {
    struct Materialize;
    impl ModuleVisitor for Materialize {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let _ = param.val();
        }
    }
    with_seed(device, seed, || {
        let module = init();
        module.visit(&mut Materialize);
        module
    })
}

/// Builds a module with `init` from `seed` on the CPU (Flex, with `device`'s autodiff
/// context) and forks it to `device`: the same weights for a seed on every device kind.
/// [`init_module`] on a GPU draws from that GPU's generator, so a CUDA or wgpu build of
/// the same seed differs from the CPU's; a pipeline whose stages sit on different kinds
/// builds each stage with this, so that its stages start from one model.
///
/// ```
/// use burn::nn::LinearConfig;
/// use burn::tensor::Device;
/// let device = Device::flex().autodiff();
/// let on_host = kiln_core::init_on_host(&device, 3, |d| LinearConfig::new(4, 2).init(d));
/// let direct = kiln_core::init_module(&device, 3, || LinearConfig::new(4, 2).init(&device));
/// assert_eq!(on_host.weight.val().into_data(), direct.weight.val().into_data());
/// assert!(on_host.weight.val().is_require_grad(), "still trainable");
/// ```
pub fn init_on_host<M: Module>(device: &Device, seed: u64, init: impl FnOnce(&Device) -> M) -> M {
    let host = Device::flex().with_autodiff_context_from(device);
    let module = init_module(&host, seed, || init(&host));
    if host == *device {
        module
    } else {
        module.fork(device)
    }
}
