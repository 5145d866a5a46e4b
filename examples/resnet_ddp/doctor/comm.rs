//! MPI and the all-reduce bandwidth.

use std::time::{Duration, Instant};

use kiln::comm::{InProcessGroup, ReduceOp};

use super::report::{Row, Status, bounded, row};
use crate::args::{Args, CommArg};

/// All-reduce bandwidth between two threads of this process over ~1 s (algorithm bandwidth:
/// buffer bytes ÷ time per all-reduce).
pub(super) fn in_process_bandwidth() -> Row {
    const ELEMENTS: usize = 4 << 20;
    let result = bounded(Duration::from_secs(30), || {
        let comms = InProcessGroup::new(2).build();
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                std::thread::spawn(move || -> Result<(usize, f64), String> {
                    let mut data = vec![1.0f32; ELEMENTS];
                    let start = Instant::now();
                    let mut rounds = 0;
                    // Rank 0 decides when to stop, so both ranks run the same rounds.
                    loop {
                        comm.all_reduce(&mut data, ReduceOp::Sum)
                            .map_err(|e| e.to_string())?;
                        rounds += 1;
                        let mut go = [f32::from(u8::from(
                            start.elapsed() < Duration::from_secs(1),
                        ))];
                        comm.broadcast(&mut go, 0).map_err(|e| e.to_string())?;
                        if go[0] == 0.0 {
                            return Ok((rounds, start.elapsed().as_secs_f64()));
                        }
                    }
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        match results.into_iter().next() {
            Some(Ok(Ok((rounds, seconds)))) => Ok(rounds as f64 * (ELEMENTS * 4) as f64 / seconds),
            Some(Ok(Err(err))) => Err(err),
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
pub(super) fn mpi_rows(args: &Args) -> Vec<Row> {
    use kiln::comm::MpiCommunicator;
    let version = MpiCommunicator::library_version();
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|var| std::env::var_os(var).is_some());
    if args.comm != CommArg::Mpi && !launched {
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
                let mut data = vec![1.0f32; 1 << 20];
                let start = Instant::now();
                let mut rounds = 0usize;
                let mut failed = None;
                while failed.is_none() {
                    if let Err(err) = world.all_reduce(&mut data, ReduceOp::Sum) {
                        failed = Some(err.to_string());
                        break;
                    }
                    rounds += 1;
                    let mut go = [f32::from(u8::from(
                        start.elapsed() < Duration::from_secs(1),
                    ))];
                    if let Err(err) = world.broadcast(&mut go, 0) {
                        failed = Some(err.to_string());
                    } else if go[0] == 0.0 {
                        break;
                    }
                }
                rows.push(match failed {
                    None => row(
                        "all-reduce",
                        Status::Ok,
                        format!(
                            "MPI, {} ranks, 4 MiB: {:.2} GB/s",
                            world.world_size(),
                            rounds as f64 * 4.0 * (1 << 20) as f64
                                / start.elapsed().as_secs_f64()
                                / 1e9
                        ),
                    ),
                    Some(err) => row("all-reduce", Status::Fail, format!("MPI: {err}")),
                });
            }
            rows
        }
        Err(err) => vec![row("mpi", Status::Fail, format!("{version}: {err}"))],
    }
}

#[cfg(not(feature = "mpi"))]
pub(super) fn mpi_rows(args: &Args) -> Vec<Row> {
    let fix = "apt-get install libopenmpi-dev openmpi-bin, then cargo build --release --features mpi --example resnet_ddp";
    let status = if args.comm == CommArg::Mpi {
        Status::Fail
    } else {
        Status::Skip
    };
    vec![row("mpi", status, "not built in").fix(fix)]
}
