//! Collectives on device tensors through Burn's own all-reduce (NCCL on CUDA).
//!
//! The host communicators reduce `f32` buffers in memory; GPUs of one process can do better:
//! Burn 0.22's `all_reduce` runs NCCL on a stream of its own, so a gradient bucket is reduced
//! without leaving the devices and while later kernels keep running. [`DeviceGroup`] is that
//! path: one per replica thread, over the distinct CUDA devices of this process.
//!
//! Burn's collective has no timeout of its own (NCCL waits for every rank inside a kernel),
//! so callers that must not hang (kiln's data-parallel step does this) prove with a host
//! collective, which does time out, that every rank has enqueued the same operations before
//! they [`wait`](PendingTensor::wait) on the result.

use burn::tensor::distributed::{CollectiveTensor, ReduceOperation, all_reduce};
use burn::tensor::{Device, Tensor};

use crate::{CommError, ReduceOp};

/// The devices of this process whose tensors reduce through Burn's native collective, as
/// seen by one of them (its rank).
#[derive(Debug, Clone)]
pub struct DeviceGroup {
    devices: Vec<Device>,
    rank: usize,
}

/// A native all-reduce in flight; [`wait`](Self::wait) for its result.
pub struct PendingTensor<const D: usize> {
    collective: CollectiveTensor<D>,
}

impl<const D: usize> std::fmt::Debug for PendingTensor<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingTensor")
    }
}

impl<const D: usize> PendingTensor<D> {
    /// Orders the reduction before any later use of the tensor and returns it. Blocks only
    /// as long as the runtime takes to queue that order, not for the reduction itself.
    pub fn wait(self) -> Tensor<D> {
        self.collective.resolve()
    }
}

impl DeviceGroup {
    /// Whether Burn has a native collective over `devices`: every one a distinct CUDA
    /// device (kiln built with feature `cuda`). Several replicas sharing one GPU, CPU
    /// devices and wgpu are served by the host communicators instead.
    pub fn supported(devices: &[Device]) -> bool {
        let indices: Option<Vec<usize>> = devices.iter().map(cuda_index).collect();
        match indices {
            Some(mut indices) if !indices.is_empty() => {
                let count = indices.len();
                indices.sort_unstable();
                indices.dedup();
                indices.len() == count
            }
            _ => false,
        }
    }

    /// The group over `devices`, seen by `devices[rank]`.
    ///
    /// # Errors
    /// [`CommError::Unsupported`] unless [`DeviceGroup::supported`] holds, and
    /// [`CommError::InvalidArgument`] if `rank` is out of range.
    pub fn new(devices: Vec<Device>, rank: usize) -> Result<Self, CommError> {
        if rank >= devices.len() {
            return Err(CommError::InvalidArgument {
                op: "device group",
                rank,
                detail: format!("rank {rank} of a group of {} devices", devices.len()),
            });
        }
        let devices: Vec<Device> = devices.into_iter().map(Device::without_autodiff).collect();
        if !Self::supported(&devices) {
            return Err(CommError::Unsupported {
                op: "device group",
                rank,
                detail: format!(
                    "Burn's native all-reduce needs distinct CUDA devices (kiln feature `cuda`), \
                     got {devices:?}"
                ),
            });
        }
        Ok(Self { devices, rank })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Devices in the group.
    pub fn world_size(&self) -> usize {
        self.devices.len()
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.devices[self.rank]
    }

    /// Starts reducing `tensor` (on this rank's device, not tracked by autodiff) with every
    /// other device of the group. Every rank must start the same reductions in the same order.
    ///
    /// # Errors
    /// [`CommError::Unsupported`] for `Max` and `Min` (Burn reduces by sum or mean only).
    pub fn all_reduce<const D: usize>(
        &self,
        tensor: Tensor<D>,
        op: ReduceOp,
    ) -> Result<PendingTensor<D>, CommError> {
        let op = match op {
            ReduceOp::Sum => ReduceOperation::Sum,
            ReduceOp::Mean => ReduceOperation::Mean,
            other => {
                return Err(CommError::Unsupported {
                    op: "device all_reduce",
                    rank: self.rank,
                    detail: format!("Burn's collective reduces by sum or mean, not {other:?}"),
                });
            }
        };
        Ok(PendingTensor {
            collective: all_reduce(tensor, op, self.devices.clone()),
        })
    }
}

/// The CUDA index of `device`, if it is a CUDA device.
#[cfg(feature = "cuda")]
fn cuda_index(device: &Device) -> Option<usize> {
    // Burn 0.22 exposes no device kind without depending on its dispatch crate; device
    // equality compares the hardware (ignoring autodiff), and constructing a CUDA device
    // value opens nothing.
    const MAX_GPUS: usize = 64;
    (0..MAX_GPUS).find(|&index| *device == Device::cuda(index))
}

#[cfg(not(feature = "cuda"))]
fn cuda_index(_device: &Device) -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_devices_are_refused_with_a_reason() {
        assert!(!DeviceGroup::supported(&[Device::flex(), Device::flex()]));
        assert!(!DeviceGroup::supported(&[]));
        let err = DeviceGroup::new(vec![Device::flex(); 2], 0).unwrap_err();
        assert!(matches!(err, CommError::Unsupported { .. }), "{err}");
        assert!(err.to_string().contains("distinct CUDA devices"), "{err}");
        let err = DeviceGroup::new(vec![Device::flex(); 2], 2).unwrap_err();
        assert!(matches!(err, CommError::InvalidArgument { .. }), "{err}");
    }
}

/// GPU runs: `cargo test -p kiln-comm --features cuda -- --ignored` on a machine with
/// `KILN_CUDA_DEVICES` (default 1) GPUs; `scripts/gpu-check.sh` does.
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use burn::tensor::TensorData;

    fn gpus() -> usize {
        std::env::var("KILN_CUDA_DEVICES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1)
    }

    /// Every GPU's rank sums and averages `values × (rank + 1)`.
    fn reduce_on(devices: Vec<Device>) -> Vec<(Vec<f32>, Vec<f32>)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..devices.len())
                .map(|rank| {
                    let devices = devices.clone();
                    scope.spawn(move || {
                        let group = DeviceGroup::new(devices, rank).unwrap();
                        let values: Vec<f32> = (0..1009).map(|i| (i * (rank + 1)) as f32).collect();
                        let tensor = Tensor::<1>::from_data(
                            TensorData::new(values.clone(), [values.len()]),
                            group.device(),
                        );
                        let sum = group.all_reduce(tensor.clone(), ReduceOp::Sum).unwrap();
                        let mean = group.all_reduce(tensor, ReduceOp::Mean).unwrap();
                        let read = |t: Tensor<1>| t.into_data().try_into_vec_as::<f32>().unwrap();
                        (read(sum.wait()), read(mean.wait()))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpus_sum_and_mean_through_burns_collective() {
        assert!(!DeviceGroup::supported(&[Device::cuda(0), Device::cuda(0)]));
        for n in [1, gpus()] {
            let devices: Vec<Device> = (0..n).map(Device::cuda).collect();
            assert!(DeviceGroup::supported(&devices));
            let factor: usize = (1..=n).sum();
            for (sum, mean) in reduce_on(devices) {
                for (i, (s, m)) in sum.iter().zip(&mean).enumerate() {
                    assert_eq!(*s, (factor * i) as f32, "{n} GPUs, element {i}");
                    let want = (factor * i) as f32 / n as f32;
                    assert!(
                        (m - want).abs() <= 1e-5 * (1.0 + want),
                        "{n} GPUs: {m} vs {want}"
                    );
                }
            }
        }
    }
}
