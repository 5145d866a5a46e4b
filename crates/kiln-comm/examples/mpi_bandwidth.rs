//! All-reduce timing over MPI, for `cargo xtask bench` (which launches it under `mpirun`).
//!
//! Usage: `mpirun -np N mpi_bandwidth REPS SIZE_MB...`. Rank 0 prints one line per size:
//! `size_mb median_seconds min_seconds max_seconds` (the slowest rank's time per operation).

use std::time::{Duration, Instant};

use kiln_comm::{MpiCommunicator, ReduceOp};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reps: usize = args.first().and_then(|r| r.parse().ok()).unwrap_or(5);
    let sizes: Vec<usize> = args.iter().skip(1).filter_map(|s| s.parse().ok()).collect();
    let comm = MpiCommunicator::world(Duration::from_secs(120)).expect("MPI");
    for mb in sizes {
        let n = (mb << 20) / 4;
        let mut data = vec![comm.rank() as f32; n];
        let mut samples = Vec::with_capacity(reps);
        for rep in 0..reps + 2 {
            comm.barrier().expect("barrier");
            let start = Instant::now();
            comm.all_reduce(&mut data, ReduceOp::Sum)
                .expect("all_reduce");
            let mut elapsed = [start.elapsed().as_secs_f32()];
            comm.all_reduce(&mut elapsed, ReduceOp::Max).expect("max");
            if rep >= 2 {
                samples.push(elapsed[0] as f64);
            }
        }
        samples.sort_by(f64::total_cmp);
        if comm.rank() == 0 {
            println!(
                "{mb} {} {} {}",
                samples[samples.len() / 2],
                samples[0],
                samples[samples.len() - 1]
            );
        }
    }
}
