//! The device gradient path ([`GradientPath::Device`]) against the single-device reference
//! (tolerances as in `tests.rs`: 5e-5 relative per tensor in f32, 2e-2 with compression).
//!
//! On CPU the device path stages buckets through the host, which exercises everything the
//! native NCCL path shares with it: gradients kept as device tensors, buckets concatenated
//! on the device, reduced buckets split back into parameters, sample-count weighting. The
//! `cuda` tests run the native path on a GPU machine:
//! `cargo test -p kiln-ddp --features cuda -- --ignored cuda` (see the `cuda` module).

use crate::test_support::{COMPRESSED, REORDERED, Setup, assert_close, data, replicated, single};
use crate::{Compression, GradientPath, SyncMode};

/// Device buckets (staged through the host on CPU: the same bucket assembly, splitting and
/// weighting the native NCCL path uses) equal the host path's reference, with and without
/// overlap, small buckets, accumulation, compression and local SGD.
#[test]
fn device_gradient_path_matches_single_device() {
    let device_setup = |world, batch| {
        let mut setup = Setup::new(world, batch);
        setup.config.gradient_path = GradientPath::Device;
        setup
    };
    for (world, overlapped) in [(2, true), (3, true), (2, false)] {
        let mut setup = device_setup(world, 4);
        setup.overlapped = overlapped;
        setup.config.bucket_cap_bytes = 512;
        setup.config.first_bucket_bytes = 128;
        assert_close(
            &replicated(&setup),
            &single(data(), 4 * world, 1, true),
            REORDERED,
            &format!("device path, {world} replicas, overlapped {overlapped}"),
        );
    }
    let mut setup = device_setup(2, 8);
    setup.micro = 2;
    assert_close(
        &replicated(&setup),
        &single(data(), 16, 1, true),
        REORDERED,
        "device path, 2 replicas x 2 micro-batches",
    );
    let mut setup = device_setup(2, 4);
    setup.config.compression = Compression::Bf16;
    assert_close(
        &replicated(&setup),
        &single(data(), 8, 1, true),
        COMPRESSED,
        "device path, bf16",
    );
    // The same arithmetic in the same order as the host buffer: bit-identical.
    let mut host = Setup::new(2, 4);
    host.config.gradient_path = GradientPath::Host;
    host.config.bucket_cap_bytes = 512;
    let mut device = device_setup(2, 4);
    device.config.bucket_cap_bytes = 512;
    assert_eq!(
        replicated(&device),
        replicated(&host),
        "device vs host path"
    );
    // Local SGD with period 1 is synchronous SGD: exercises the unreduced device buckets.
    let mut setup = device_setup(2, 4);
    setup.config.mode = SyncMode::LocalSgd { period: 1 };
    assert_close(
        &replicated(&setup),
        &single(data(), 8, 1, true),
        REORDERED,
        "device path, local SGD period 1",
    );
}

/// GPU runs: `cargo test -p kiln-ddp --features cuda -- --ignored cuda` on a machine with
/// `KILN_CUDA_DEVICES` (default 1) GPUs.
#[cfg(feature = "cuda")]
mod cuda {
    use burn::tensor::Device;

    use super::*;
    use crate::test_support::single_on;

    fn gpus() -> usize {
        std::env::var("KILN_CUDA_DEVICES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1)
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_device_paths_match_the_single_gpu_reference() {
        let gpu = Device::cuda(0);
        // Native collective over one GPU (a one-rank NCCL group), then two replicas sharing
        // it (staged: NCCL needs distinct devices).
        let reference = single_on(gpu.clone(), data(), 8, 1, true);
        let mut native = Setup::new(1, 8);
        native.devices = vec![gpu.clone()];
        native.config.gradient_path = GradientPath::Device;
        assert_close(&replicated(&native), &reference, REORDERED, "native, 1 GPU");
        let mut staged = Setup::new(2, 4);
        staged.devices = vec![gpu.clone(); 2];
        staged.config.gradient_path = GradientPath::Device;
        assert_close(
            &replicated(&staged),
            &reference,
            REORDERED,
            "staged, 2 replicas on 1 GPU",
        );
        let mut host = Setup::new(2, 4);
        host.devices = vec![gpu.clone(); 2];
        host.config.gradient_path = GradientPath::Host;
        assert_close(
            &replicated(&host),
            &reference,
            REORDERED,
            "host, 2 replicas on 1 GPU",
        );
        let n = gpus();
        if n >= 2 {
            let reference = single_on(gpu, data(), 4 * n, 1, true);
            let mut native = Setup::new(n, 4);
            native.devices = (0..n).map(Device::cuda).collect();
            native.config.gradient_path = GradientPath::Device;
            assert_close(
                &replicated(&native),
                &reference,
                REORDERED,
                "native, N GPUs",
            );
            native.config.compression = Compression::Bf16;
            assert_close(
                &replicated(&native),
                &reference,
                COMPRESSED,
                "native bf16, N GPUs",
            );
        }
    }
}

/// wgpu runs (Mesa's lavapipe, a CPU Vulkan driver, in CI):
/// `cargo test -p kiln-ddp --features wgpu -- --ignored wgpu`. Every data-parallel step
/// runs Burn's own kernels there (kiln's CPU kernels are Flex's only), so this checks that
/// kiln's synchronisation is backend-neutral.
#[cfg(feature = "wgpu-bare")]
mod wgpu {
    use burn::tensor::{Device, DeviceKind};
    use kiln_amp::Precision;

    use super::*;
    use crate::compare::{HALF_PRECISION, change_error};
    use crate::test_support::{Schedule, TinyNet, single_on, single_with, start_of};

    fn adapter() -> Device {
        Device::wgpu(DeviceKind::DefaultDevice)
    }

    /// Unsynchronised replicas (the control) must miss the reference by `factor` × `tolerance`.
    fn control_fails(setup: &mut Setup, reference: &[Vec<f32>], tolerance: f32, what: &str) {
        setup.config.mode = SyncMode::Unsynchronized;
        let start = start_of(reference).expect("trained by `single_with`");
        let worst = change_error(&replicated(setup), reference, &start, what);
        assert!(
            worst.error > 4.0 * tolerance,
            "{what}: the control passed: {worst:?}"
        );
    }

    #[test]
    #[ignore = "needs a wgpu adapter (Mesa's lavapipe serves)"]
    fn wgpu_replicas_match_one_wgpu_device() {
        let gpu = adapter();
        let reference = single_on(gpu.clone(), data(), 8, 1, true);
        for path in [GradientPath::Host, GradientPath::Device] {
            let mut setup = Setup::new(2, 4);
            setup.devices = vec![gpu.clone(); 2];
            setup.config.gradient_path = path;
            setup.config.bucket_cap_bytes = 512;
            assert_close(
                &replicated(&setup),
                &reference,
                REORDERED,
                &format!("wgpu, {path:?}"),
            );
        }
        let mut setup = Setup::new(2, 4);
        setup.devices = vec![gpu; 2];
        control_fails(&mut setup, &reference, REORDERED, "wgpu, unsynchronised");
    }

    /// lavapipe computes f16 (not bf16): mixed precision with loss scaling on the adapter.
    #[test]
    #[ignore = "needs a wgpu adapter with f16 (Mesa's lavapipe serves)"]
    fn f16_wgpu_replicas_match_f16_on_one_wgpu_device() {
        let gpu = adapter();
        let f16 = Schedule {
            precision: Precision::F16,
            ..Schedule::default()
        };
        let reference = single_with(gpu.clone(), data(), 8, 1, true, &f16, TinyNet::new);
        let mut setup = Setup::new(2, 4);
        setup.devices = vec![gpu; 2];
        setup.schedule = f16;
        assert_close(&replicated(&setup), &reference, HALF_PRECISION, "wgpu, f16");
        control_fails(
            &mut setup,
            &reference,
            HALF_PRECISION,
            "wgpu f16, unsynchronised",
        );
    }
}

/// One replica's parameters, synchronisation statistics and communicator operations.
fn lone_run(setup: &Setup) -> (Vec<Vec<f32>>, crate::SyncStats, usize) {
    let run = crate::test_support::replicated_runs(setup, |device| {
        crate::test_support::TinyNet::build(device, setup.batch_norm)
    })
    .swap_remove(0);
    (run.params, run.stats, run.operations)
}

/// A replica with no peers runs the plain step on either gradient path: no buckets, no
/// collective, nothing reported exchanged; its parameters equal one device's training
/// (the host path's, bit for bit). Control: two replicas do bucket and reduce.
#[test]
fn a_lone_replica_exchanges_nothing() {
    for (overlapped, micro) in [(true, 1), (false, 1), (true, 2)] {
        let mut device = Setup::new(1, 8);
        device.config.gradient_path = GradientPath::Device;
        device.overlapped = overlapped;
        device.micro = micro;
        let (trained, stats, operations) = lone_run(&device);
        let what =
            format!("one replica, device path, overlapped {overlapped}, {micro} micro-batch(es)");
        assert_eq!(stats.buckets, 0, "{what}: buckets");
        assert_eq!(stats.bytes, 0, "{what}: bytes");
        assert!(
            stats.communication.is_zero() && stats.exposed.is_zero(),
            "{what}: {stats:?}"
        );
        assert_eq!(operations, 0, "{what}: collective operations");
        assert_close(
            std::slice::from_ref(&trained),
            &single(data(), 8, 1, true),
            REORDERED,
            &what,
        );
        let mut host = Setup::new(1, 8);
        host.config.gradient_path = GradientPath::Host;
        host.overlapped = overlapped;
        host.micro = micro;
        let (host_trained, host_stats, host_operations) = lone_run(&host);
        assert_eq!(trained, host_trained, "{what}: against the host path");
        assert_eq!(
            (host_stats.buckets, host_operations),
            (0, 0),
            "{what}: host path"
        );
    }
    let mut pair = Setup::new(2, 8);
    pair.config.gradient_path = GradientPath::Device;
    let (_, stats, operations) = lone_run(&pair);
    assert!(
        stats.buckets > 0 && operations > 0,
        "control: two replicas exchange ({stats:?}, {operations} operations)"
    );
}
