//! Collectives on device tensors: Burn's own all-reduce (NCCL on CUDA), or a host
//! communicator.
//!
//! The host communicators reduce `f32` buffers in memory; GPUs of one process can do better:
//! Burn 0.22's `all_reduce` runs NCCL on a stream of its own, so a gradient bucket is reduced
//! without leaving the devices and while later kernels keep running. [`DeviceGroup`] gives
//! device tensors one all-reduce over either: [`DeviceGroup::native`] over the distinct CUDA
//! devices of this process, or [`DeviceGroup::through_host`] over any communicator (the
//! tensor is copied to the host on the communication thread, reduced in its own element
//! type, and copied back), for MPI worlds, replicas sharing a device, wgpu and CPU. kiln's
//! data-parallel step uses the same code over both, which is how its GPU path is tested on
//! CPU.
//!
//! Burn's collective has no timeout of its own (NCCL waits for every rank inside a kernel),
//! so callers that must not hang (kiln's data-parallel step does this) prove with a host
//! collective, which does time out, that every rank has enqueued the same operations before
//! they [`wait`](PendingTensor::wait) on the result.

use std::sync::Arc;

use burn::tensor::distributed::{CollectiveTensor, ReduceOperation, all_reduce};
use burn::tensor::{DType, Device, Tensor, TensorData};
use half::{bf16, f16};

use crate::{CommError, CommWorker, Communicator, Pending, ReduceOp, Timed};

/// Device tensors reduced across replicas, as seen by one of them (its rank).
///
/// ```
/// use std::sync::Arc;
/// use burn::tensor::{Device, Tensor};
/// use kiln_comm::{CommWorker, DeviceGroup, InProcessGroup, ReduceOp};
///
/// let sums: Vec<Vec<f32>> = std::thread::scope(|scope| {
///     let handles: Vec<_> = InProcessGroup::new(2)
///         .build()
///         .into_iter()
///         .map(|comm| {
///             scope.spawn(move || {
///                 // On distinct GPUs: DeviceGroup::native(devices, rank) instead.
///                 let group = DeviceGroup::through_host(Arc::new(CommWorker::spawn(comm)), Device::flex());
///                 let tensor = Tensor::<1>::ones([3], group.device()) * (group.rank() + 1) as f32;
///                 let pending = group.all_reduce(tensor, ReduceOp::Sum).unwrap();
///                 let sum = pending.wait().unwrap().value;
///                 sum.into_data().convert::<f32>().try_into_vec::<f32>().unwrap()
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(sums, vec![vec![3.0; 3]; 2]);
/// ```
#[derive(Debug, Clone)]
pub struct DeviceGroup {
    backend: Backend,
    rank: usize,
}

#[derive(Debug, Clone)]
enum Backend {
    /// Burn's collective over these devices (this rank's is `devices[rank]`).
    Native { devices: Vec<Device> },
    /// A host communicator; results go back to `device`.
    Host {
        comm: Arc<CommWorker>,
        device: Device,
    },
}

/// An all-reduce in flight; [`wait`](Self::wait) for its result.
pub struct PendingTensor<const D: usize> {
    inner: Inner<D>,
}

enum Inner<const D: usize> {
    Native(CollectiveTensor<D>),
    Host {
        pending: Pending<TensorData>,
        device: Device,
    },
}

impl<const D: usize> std::fmt::Debug for PendingTensor<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.inner {
            Inner::Native(_) => "PendingTensor(native)",
            Inner::Host { .. } => "PendingTensor(host)",
        })
    }
}

impl<const D: usize> PendingTensor<D> {
    /// The reduced tensor. Native: orders the reduction before any later use of the tensor,
    /// blocking only while the runtime queues that order. Host: waits (with the
    /// communicator's timeout) for the reduction.
    ///
    /// Also returns how long the communication thread spent on it (zero on the native
    /// path, whose reduction runs on NCCL's stream, untimed).
    ///
    /// # Errors
    /// The host communicator's error (timeout, lost peer); the native path reports none.
    pub fn wait(self) -> Result<Timed<Tensor<D>>, CommError> {
        match self.inner {
            Inner::Native(collective) => Ok(Timed {
                value: collective.resolve(),
                busy: std::time::Duration::ZERO,
            }),
            Inner::Host { pending, device } => {
                let done = pending.wait()?;
                let dtype = done.value.dtype();
                Ok(Timed {
                    // In the element type it travelled in (the input's).
                    value: Tensor::from_data(done.value, (&device, dtype)),
                    busy: done.busy,
                })
            }
        }
    }
}

impl DeviceGroup {
    /// Whether Burn has a native collective over `devices`: every one a distinct CUDA
    /// device (kiln built with feature `cuda`). Several replicas sharing one GPU, CPU
    /// devices and wgpu use [`DeviceGroup::through_host`] instead.
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

    /// Burn's native collective over `devices`, seen by `devices[rank]`.
    ///
    /// # Errors
    /// [`CommError::Unsupported`] unless [`DeviceGroup::supported`] holds, and
    /// [`CommError::InvalidArgument`] if `rank` is out of range.
    pub fn native(devices: Vec<Device>, rank: usize) -> Result<Self, CommError> {
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
        Ok(Self {
            backend: Backend::Native { devices },
            rank,
        })
    }

    /// Device tensors on `device` reduced through `comm` (any backend, any world).
    pub fn through_host(comm: Arc<CommWorker>, device: Device) -> Self {
        let rank = comm.rank();
        Self {
            backend: Backend::Host {
                comm,
                device: device.without_autodiff(),
            },
            rank,
        }
    }

    /// Whether this is Burn's native collective.
    pub fn is_native(&self) -> bool {
        matches!(self.backend, Backend::Native { .. })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn world_size(&self) -> usize {
        match &self.backend {
            Backend::Native { devices } => devices.len(),
            Backend::Host { comm, .. } => comm.world_size(),
        }
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        match &self.backend {
            Backend::Native { devices } => &devices[self.rank],
            Backend::Host { device, .. } => device,
        }
    }

    /// Starts reducing `tensor` (on this rank's device, not tracked by autodiff) with every
    /// other rank. Every rank must start the same reductions in the same order. Half-
    /// precision tensors travel as halves (reduced in `f32` on the host path).
    ///
    /// # Errors
    /// [`CommError::Unsupported`] for `Max` and `Min` on the native path (Burn reduces by
    /// sum or mean only).
    pub fn all_reduce<const D: usize>(
        &self,
        tensor: Tensor<D>,
        op: ReduceOp,
    ) -> Result<PendingTensor<D>, CommError> {
        match &self.backend {
            Backend::Native { devices } => {
                let op = match op {
                    ReduceOp::Sum => ReduceOperation::Sum,
                    ReduceOp::Mean => ReduceOperation::Mean,
                    other => {
                        return Err(CommError::Unsupported {
                            op: "device all_reduce",
                            rank: self.rank,
                            detail: format!(
                                "Burn's collective reduces by sum or mean, not {other:?}"
                            ),
                        });
                    }
                };
                Ok(PendingTensor {
                    inner: Inner::Native(all_reduce(tensor, op, devices.clone())),
                })
            }
            Backend::Host { comm, device } => {
                // Copied to the host on the communication thread, so the caller goes on
                // queueing work meanwhile.
                let pending = comm.submit(move |c| reduce_on_host(c, tensor.into_data(), op));
                Ok(PendingTensor {
                    inner: Inner::Host {
                        pending,
                        device: device.clone(),
                    },
                })
            }
        }
    }
}

/// All-reduces `data` through `comm` in its own element type (halves stay halves).
fn reduce_on_host(
    comm: &Communicator,
    data: TensorData,
    op: ReduceOp,
) -> Result<TensorData, CommError> {
    let shape = data.shape().clone();
    let invalid = |err: &dyn std::fmt::Debug| CommError::InvalidArgument {
        op: "device all_reduce",
        rank: comm.rank(),
        detail: format!("{err:?}"),
    };
    Ok(match data.dtype() {
        DType::F16 => {
            let mut values = data.try_into_vec::<f16>().map_err(|e| invalid(&e))?;
            comm.all_reduce(&mut values, op)?;
            TensorData::new(values, shape)
        }
        DType::BF16 => {
            let mut values = data.try_into_vec::<bf16>().map_err(|e| invalid(&e))?;
            comm.all_reduce(&mut values, op)?;
            TensorData::new(values, shape)
        }
        _ => {
            let mut values = data
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| invalid(&e))?;
            comm.all_reduce(&mut values, op)?;
            TensorData::new(values, shape)
        }
    })
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
        let err = DeviceGroup::native(vec![Device::flex(); 2], 0).unwrap_err();
        assert!(matches!(err, CommError::Unsupported { .. }), "{err}");
        assert!(err.to_string().contains("distinct CUDA devices"), "{err}");
        let err = DeviceGroup::native(vec![Device::flex(); 2], 2).unwrap_err();
        assert!(matches!(err, CommError::InvalidArgument { .. }), "{err}");
    }

    /// The host-backed group reduces device tensors in their own dtype, for any world.
    #[test]
    fn through_host_reduces_f32_and_half_tensors() {
        use crate::InProcessGroup;
        use burn::tensor::{FloatDType, TensorData};

        let world = 3;
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = InProcessGroup::new(world)
                .build()
                .into_iter()
                .map(|comm| {
                    scope.spawn(move || {
                        let comm = Arc::new(CommWorker::spawn(comm));
                        let group = DeviceGroup::through_host(comm, Device::flex());
                        assert!(!group.is_native());
                        let rank = group.rank() as f32;
                        let values: Vec<f32> = (0..7).map(|i| i as f32 + rank).collect();
                        let tensor =
                            Tensor::<2>::from_data(TensorData::new(values, [7, 1]), group.device());
                        let sum = group.all_reduce(tensor.clone(), ReduceOp::Sum).unwrap();
                        let max = group.all_reduce(tensor.clone(), ReduceOp::Max).unwrap();
                        let half = tensor.cast(FloatDType::F16);
                        let half_sum = group.all_reduce(half, ReduceOp::Sum).unwrap();
                        let read = |t: Tensor<2>| {
                            (
                                t.dims(),
                                t.dtype(),
                                t.into_data()
                                    .convert::<f32>()
                                    .try_into_vec::<f32>()
                                    .unwrap(),
                            )
                        };
                        (
                            read(sum.wait().unwrap().value),
                            read(max.wait().unwrap().value),
                            read(half_sum.wait().unwrap().value),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (sum, max, half_sum) in results {
            let expect_sum: Vec<f32> = (0..7).map(|i| 3.0 * i as f32 + 3.0).collect();
            let expect_max: Vec<f32> = (0..7).map(|i| i as f32 + 2.0).collect();
            assert_eq!(sum.0, [7, 1]);
            assert_eq!((sum.1, sum.2), (DType::F32, expect_sum.clone()));
            assert_eq!(max.2, expect_max);
            assert_eq!((half_sum.1, half_sum.2), (DType::F16, expect_sum));
        }
    }
}

/// GPU runs: `cargo test -p kiln-comm --features cuda -- --ignored` on a machine with
/// `KILN_CUDA_DEVICES` (default 1) GPUs.
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
                        let group = DeviceGroup::native(devices, rank).unwrap();
                        let values: Vec<f32> = (0..1009).map(|i| (i * (rank + 1)) as f32).collect();
                        let tensor = Tensor::<1>::from_data(
                            TensorData::new(values.clone(), [values.len()]),
                            group.device(),
                        );
                        let sum = group.all_reduce(tensor.clone(), ReduceOp::Sum).unwrap();
                        let mean = group.all_reduce(tensor, ReduceOp::Mean).unwrap();
                        let read = |t: Tensor<1>| t.into_data().try_into_vec_as::<f32>().unwrap();
                        (
                            read(sum.wait().unwrap().value),
                            read(mean.wait().unwrap().value),
                        )
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
