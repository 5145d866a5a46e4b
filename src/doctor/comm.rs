//! MPI and the all-reduce bandwidth.

use std::time::{Duration, Instant};

use crate::comm::{Communicator, InProcessGroup, ReduceOp};

use super::report::{Row, Status, bounded, row};

/// The all-reduce rate of `comm` on `elements` f32s over about a second, in bytes per second
/// (algorithm bandwidth: buffer bytes ÷ time per all-reduce). Rank 0 decides when to stop
/// and broadcasts it, so every rank runs the same rounds.
fn all_reduce_rate(comm: &Communicator, elements: usize) -> Result<f64, String> {
    let mut data = vec![1.0f32; elements];
    let start = Instant::now();
    let mut rounds = 0usize;
    loop {
        comm.all_reduce(&mut data, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        rounds += 1;
        let mut go = [f32::from(u8::from(
            start.elapsed() < Duration::from_secs(1),
        ))];
        comm.broadcast(&mut go, 0).map_err(|e| e.to_string())?;
        if go[0] == 0.0 {
            return Ok((rounds * elements * 4) as f64 / start.elapsed().as_secs_f64());
        }
    }
}

/// All-reduce bandwidth between two threads of this process.
pub(super) fn in_process_bandwidth() -> Row {
    const ELEMENTS: usize = 4 << 20;
    let result = bounded(Duration::from_secs(30), || {
        let handles: Vec<_> = InProcessGroup::new(2)
            .build()
            .into_iter()
            .map(|comm| std::thread::spawn(move || all_reduce_rate(&comm, ELEMENTS)))
            .collect();
        let mut rates = handles.into_iter().map(|h| h.join());
        match rates.next() {
            Some(Ok(rate)) => rate,
            _ => Err("a rank panicked".to_string()),
        }
    })
    .and_then(|r| r);
    match result {
        Ok(bytes_per_second) => row(
            "all-reduce",
            Status::Ok,
            format!(
                "in-process, 2 threads, 16 MiB: {:.2} GB/s",
                bytes_per_second / 1e9
            ),
        ),
        Err(why) => row("all-reduce", Status::Fail, format!("in-process: {why}")),
    }
}

#[cfg(feature = "mpi")]
pub(super) fn mpi_rows(required: bool) -> Vec<Row> {
    use crate::comm::MpiCommunicator;
    let version = MpiCommunicator::library_version();
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|var| std::env::var_os(var).is_some());
    if !required && !launched {
        return vec![row(
            "mpi",
            Status::Note,
            format!("{version}; not started (run under mpirun, or pass --comm mpi)"),
        )];
    }
    match MpiCommunicator::world(Duration::from_secs(60)) {
        Ok(world) => {
            let threads = if MpiCommunicator::thread_multiple() {
                "MPI_THREAD_MULTIPLE"
            } else {
                "no MPI_THREAD_MULTIPLE (pipelines across processes refused)"
            };
            let mut rows = vec![row(
                "mpi",
                Status::Ok,
                format!(
                    "{version}; rank {} of {}; {threads}",
                    world.rank(),
                    world.world_size()
                ),
            )];
            if world.world_size() > 1 {
                rows.push(match all_reduce_rate(&world, 1 << 20) {
                    Ok(rate) => row(
                        "all-reduce",
                        Status::Ok,
                        format!(
                            "MPI, {} ranks, 4 MiB: {:.2} GB/s",
                            world.world_size(),
                            rate / 1e9
                        ),
                    ),
                    Err(err) => row("all-reduce", Status::Fail, format!("MPI: {err}")),
                });
            }
            rows
        }
        Err(err) => vec![row("mpi", Status::Fail, format!("{version}: {err}"))],
    }
}

#[cfg(not(feature = "mpi"))]
pub(super) fn mpi_rows(required: bool) -> Vec<Row> {
    let fix = "apt-get install libopenmpi-dev openmpi-bin, then cargo build --release --features mpi --example resnet_ddp";
    let status = if required { Status::Fail } else { Status::Skip };
    vec![row("mpi", status, "not built in").fix(fix)]
}
