//! Measuring how fast the devices exchange data: the all-reduce kiln's data parallelism uses,
//! and a tensor's move from one pipeline stage's device to the next.

use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor};
use kiln_comm::{InProcessGroup, ReduceOp};

use crate::cost::Interconnect;
use crate::profile::ProfileError;

/// Buffer sizes timed: small enough to expose the fixed cost, large enough for bandwidth.
const SMALL: usize = 16 << 10;
const LARGE: usize = 4 << 20;

/// Measures in-process all-reduces over `ranks` threads (the median of `runs` at 64 KiB and
/// at 16 MiB, fitted as latency + bytes × seconds per byte), and the time to move a 16 MiB
/// tensor from `devices[0]` to `devices[1]` (none with a single device; Burn's CPU devices
/// share memory, so the move costs only what `to_device` does there).
///
/// # Errors
/// [`ProfileError::Device`] when a device fails or a rank of the group is lost.
pub fn measure_interconnect(
    ranks: usize,
    devices: &[Device],
    runs: usize,
) -> Result<Interconnect, ProfileError> {
    let runs = runs.max(1);
    let (latency, per_byte) = if ranks > 1 {
        let small = all_reduce_seconds(ranks, SMALL, runs)?;
        let large = all_reduce_seconds(ranks, LARGE, runs)?;
        // Seconds per byte of the ring's 2(n−1)/n traffic per byte, as `Interconnect` wants.
        let ring = 2.0 * (ranks - 1) as f64 / ranks as f64;
        let per_byte = ((large - small) / ((LARGE - SMALL) * 4) as f64 / ring).max(0.0);
        let latency = (small - ring * (SMALL * 4) as f64 * per_byte).max(0.0);
        (latency, per_byte)
    } else {
        (0.0, 0.0)
    };
    let transfer = match devices {
        [from, to, ..] => transfer_seconds_per_byte(from, to, runs)?,
        _ => 0.0,
    };
    Ok(Interconnect {
        all_reduce_latency: latency,
        all_reduce_seconds_per_byte: per_byte,
        transfer_seconds_per_byte: transfer,
    })
}

/// The median seconds of an all-reduce of `len` f32 over `ranks` in-process ranks.
fn all_reduce_seconds(ranks: usize, len: usize, runs: usize) -> Result<f64, ProfileError> {
    let comms = InProcessGroup::new(ranks)
        .timeout(Duration::from_secs(60))
        .build();
    let lost = |err: String| ProfileError::Device {
        device: format!("an in-process group of {ranks}"),
        message: err,
    };
    let times = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                scope.spawn(move || -> Result<Vec<f64>, String> {
                    let mut data = vec![1.0f32; len];
                    let mut times = Vec::with_capacity(runs);
                    for run in 0..=runs {
                        comm.barrier().map_err(|e| e.to_string())?;
                        let start = Instant::now();
                        comm.all_reduce(&mut data, ReduceOp::Sum)
                            .map_err(|e| e.to_string())?;
                        if run > 0 {
                            times.push(start.elapsed().as_secs_f64());
                        }
                    }
                    Ok(times)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect::<Result<Vec<_>, _>>()
    })
    .map_err(lost)?;
    // A collective ends when its slowest rank does.
    let slowest: Vec<f64> = (0..runs)
        .map(|run| times.iter().map(|t| t[run]).fold(0.0, f64::max))
        .collect();
    Ok(crate::profile::median(slowest))
}

/// Seconds per byte of moving a tensor from `from` to `to`, the median over `runs`.
fn transfer_seconds_per_byte(from: &Device, to: &Device, runs: usize) -> Result<f64, ProfileError> {
    let failed = |device: &Device, err: String| ProfileError::Device {
        device: format!("{device:?}"),
        message: err,
    };
    let tensor = Tensor::<1>::ones([LARGE], from);
    let mut times = Vec::with_capacity(runs);
    for run in 0..=runs {
        from.sync().map_err(|e| failed(from, e.to_string()))?;
        let start = Instant::now();
        let moved = tensor.clone().to_device(to);
        to.sync().map_err(|e| failed(to, e.to_string()))?;
        drop(moved);
        if run > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(crate::profile::median(times) / (LARGE * 4) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_finite_cost_and_none_for_one_rank() {
        // Its buffers would disturb the tests that count the heap.
        let _alone = crate::memory::MEASURING.lock();
        let cpu = Device::flex();
        let net = measure_interconnect(2, &[cpu.clone(), cpu.clone()], 3).unwrap();
        for value in [
            net.all_reduce_latency,
            net.all_reduce_seconds_per_byte,
            net.transfer_seconds_per_byte,
        ] {
            assert!(value.is_finite() && value >= 0.0, "{net:?}");
        }
        // Reducing 16 MiB takes time: the fit cannot be all latency.
        assert!(net.all_reduce(2, 16 << 20) > 0.0, "{net:?}");
        let alone = measure_interconnect(1, &[cpu], 3).unwrap();
        assert_eq!(alone.all_reduce(1, 1 << 20), 0.0);
        assert_eq!(alone.transfer_seconds_per_byte, 0.0);
    }
}
