//! Checks every collective of the MPI backend against a serial reference.
//!
//! ```text
//! cargo build --release -p kiln-comm --features mpi --example mpi_check
//! mpirun --allow-run-as-root --oversubscribe -np 4 target/release/examples/mpi_check
//! ```
//! Exits non-zero on the first mismatch. MPI initialises once per process, so this is a
//! program run under `mpirun` rather than a `cargo test` case.
//!
//! After the world's checks, the world is split as a data-parallel pipeline would split it
//! (`rank = row × columns + column`, two columns when the world is even): every collective
//! and point-to-point is checked again within each column (the copies of a stage) and each
//! row (a pipeline), and tagged messages travel within each row only.

use std::process::ExitCode;
use std::time::Duration;

use half::{bf16, f16};
use kiln_comm::{CommWorker, Communicator, MpiCommunicator, MpiMessages, ReduceBuffer, ReduceOp};

#[path = "../src/check_inputs.rs"]
mod check_inputs;

use check_inputs::{input, reference};

const LENGTHS: [usize; 6] = [0, 1, 2, 7, 1009, 100_003];

/// Counts the checks passed; the first failure is the error.
#[derive(Default)]
struct Checks {
    count: usize,
}

impl Checks {
    fn expect(&mut self, ok: bool, what: String) -> Result<(), String> {
        if ok {
            self.count += 1;
            Ok(())
        } else {
            Err(what)
        }
    }
}

/// Every collective of `comm` on each of [`LENGTHS`], then rank-order sums (MPI), half
/// precision and, with `point_to_point`, messages around a ring.
fn check(comm: &Communicator, point_to_point: bool) -> Result<usize, String> {
    let mut checks = Checks::default();
    for &len in &LENGTHS {
        check_collectives(comm, len, &mut checks)?;
    }
    if matches!(comm, Communicator::Mpi(_)) {
        check_rank_order(comm, &mut checks)?;
    }
    check_half_precision(comm, &mut checks)?;
    if point_to_point && comm.world_size() > 1 {
        check_ring(comm, &mut checks)?;
    }
    comm.barrier().map_err(|e| e.to_string())?;
    Ok(checks.count)
}

/// All-reduce (each op), the buffered all-reduce, broadcast, all-gather and reduce-scatter
/// of `len` values against the serial reference.
fn check_collectives(comm: &Communicator, len: usize, checks: &mut Checks) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        let mut data = input(rank, len);
        comm.all_reduce(&mut data, op).map_err(|e| e.to_string())?;
        // MPI may sum in any order: compare with a tolerance of a few ulps.
        let want = reference(world, len, op);
        let close = data
            .iter()
            .zip(&want)
            .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0));
        checks.expect(close, format!("all_reduce {op:?} len {len}"))?;
    }
    let mut buffer = ReduceBuffer::new(len, world);
    buffer.copy_from(&input(rank, len));
    comm.all_reduce_buffer(&mut buffer, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let mut out = vec![0.0; len];
    buffer.copy_to(&mut out);
    let want = reference(world, len, ReduceOp::Sum);
    checks.expect(
        out.iter()
            .zip(&want)
            .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0)),
        format!("all_reduce_buffer len {len}"),
    )?;

    let root = len % world;
    let mut data = if rank == root {
        input(root, len)
    } else {
        vec![0.0; len]
    };
    comm.broadcast(&mut data, root).map_err(|e| e.to_string())?;
    checks.expect(data == input(root, len), format!("broadcast len {len}"))?;

    let mut gathered = vec![0.0; len * world];
    comm.all_gather(&input(rank, len), &mut gathered)
        .map_err(|e| e.to_string())?;
    checks.expect(
        gathered == (0..world).flat_map(|r| input(r, len)).collect::<Vec<_>>(),
        format!("all_gather len {len}"),
    )?;

    let mut part = vec![0.0; len];
    comm.reduce_scatter(&input(rank, len * world), &mut part, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let full = reference(world, len * world, ReduceOp::Sum);
    let want = &full[rank * len..(rank + 1) * len];
    checks.expect(
        part.iter()
            .zip(want)
            .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0)),
        format!("reduce_scatter len {len}"),
    )?;
    Ok(())
}

/// In rank order: the in-process backend's bits exactly, with values whose sum depends on
/// the order (thirds, unlike the inputs above).
fn check_rank_order(comm: &Communicator, checks: &mut Checks) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let thirds = |r: usize, len: usize| -> Vec<f32> {
        input(r, len).iter().map(|v| v / 3.0 + 0.1).collect()
    };
    for len in [0, 1, 5, 1009] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let mut data = thirds(rank, len);
            comm.all_reduce_in_rank_order(&mut data, op)
                .map_err(|e| e.to_string())?;
            let mut want = thirds(0, len);
            for r in 1..world {
                for (a, v) in want.iter_mut().zip(thirds(r, len)) {
                    *a = if op == ReduceOp::Max {
                        a.max(v)
                    } else {
                        *a + v
                    };
                }
            }
            if op == ReduceOp::Mean {
                want.iter_mut().for_each(|a| *a /= world as f32);
            }
            let same = data
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            checks.expect(same, format!("all_reduce_in_rank_order {op:?} len {len}"))?;
        }
    }
    Ok(())
}

/// f16 and bf16 all-reduces, within their precision of the f32 reference.
fn check_half_precision(comm: &Communicator, checks: &mut Checks) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let source: Vec<f32> = input(rank, 1009);
    let mut h: Vec<f16> = source.iter().map(|&v| f16::from_f32(v)).collect();
    let mut b: Vec<bf16> = source.iter().map(|&v| bf16::from_f32(v)).collect();
    comm.all_reduce(&mut h, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    comm.all_reduce(&mut b, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let want = reference(world, 1009, ReduceOp::Sum);
    checks.expect(
        h.iter()
            .zip(&want)
            .all(|(g, w)| (g.to_f32() - w).abs() <= w.abs() * 4.9e-4 + 1e-6),
        "f16 all_reduce".into(),
    )?;
    checks.expect(
        b.iter()
            .zip(&want)
            .all(|(g, w)| (g.to_f32() - w).abs() <= w.abs() * 3.9e-3 + 1e-6),
        "bf16 all_reduce".into(),
    )?;
    Ok(())
}

/// Point to point around a ring: a small message (sent eagerly by MPI), then a large one
/// (MPI waits for the receiver), with even ranks sending first and odd ranks receiving
/// first so that the ring cannot deadlock. Under the hybrid backend the ring crosses
/// processes between the last local replica of one process and the first of the next.
fn check_ring(comm: &Communicator, checks: &mut Checks) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let (next, previous) = ((rank + 1) % world, (rank + world - 1) % world);
    comm.send(&input(rank, 13), next)
        .map_err(|e| e.to_string())?;
    let mut got = vec![0.0f32; 13];
    comm.recv(&mut got, previous).map_err(|e| e.to_string())?;
    checks.expect(got == input(previous, 13), "send/recv ring".into())?;
    let large = 100_003;
    let mut got = vec![0.0f32; large];
    if rank % 2 == 0 {
        comm.send(&input(rank, large), next)
            .map_err(|e| e.to_string())?;
        comm.recv(&mut got, previous).map_err(|e| e.to_string())?;
    } else {
        comm.recv(&mut got, previous).map_err(|e| e.to_string())?;
        comm.send(&input(rank, large), next)
            .map_err(|e| e.to_string())?;
    }
    checks.expect(got == input(previous, large), "large send/recv ring".into())?;
    checks.count += 2;
    Ok(())
}

/// Splits `world` into columns and rows and checks each sub-group: its size and rank, every
/// collective in it, and tagged messages that stay inside a row while every row sends.
fn check_splits(world: &Communicator) -> Result<usize, String> {
    let (rank, size) = (world.rank(), world.world_size());
    let columns = if size.is_multiple_of(2) { 2 } else { 1 };
    let rows = size / columns;
    let (row, column) = (rank / columns, rank % columns);
    // The key reverses the rows: the column's rank 0 is its last row.
    let copies = world
        .split(column, rows - 1 - row)
        .map_err(|e| e.to_string())?;
    let pipeline = world.split(row, column).map_err(|e| e.to_string())?;
    let mut checks = 0;
    if (copies.rank(), copies.world_size()) != (rows - 1 - row, rows)
        || (pipeline.rank(), pipeline.world_size()) != (column, columns)
    {
        return Err(format!(
            "split ranks: column {}/{} row {}/{}",
            copies.rank(),
            copies.world_size(),
            pipeline.rank(),
            pipeline.world_size()
        ));
    }
    checks += check(&copies, true).map_err(|what| format!("column {column}: {what}"))?;
    checks += check(&pipeline, true).map_err(|what| format!("row {row}: {what}"))?;
    // A sum over a column differs from one over the world: the split really groups.
    let mut ranks = vec![rank as f32];
    copies
        .all_reduce(&mut ranks, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let want: usize = (0..rows).map(|r| r * columns + column).sum();
    if ranks[0] != want as f32 {
        return Err(format!("column {column} sum {} != {want}", ranks[0]));
    }
    checks += 1;
    // Every row's ranks send to their next one under one tag at once; each receives its
    // row's message only, its sender named by the row's rank.
    if columns > 1 {
        let messages = MpiMessages::new(&pipeline, 7).map_err(|e| e.to_string())?;
        let next = (column + 1) % columns;
        messages
            .send(next, &(rank as u32).to_le_bytes())
            .map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        let (from, bytes) = loop {
            if let Some(got) = messages.try_recv() {
                break got;
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err("no message within the row".into());
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        let previous = (column + columns - 1) % columns;
        let sender = u32::from_le_bytes(bytes[..4].try_into().map_err(|_| "short message")?);
        if from != previous || sender as usize != row * columns + previous {
            return Err(format!(
                "row {row}: message from {from} (world rank {sender})"
            ));
        }
        checks += 1;
    }
    world.barrier().map_err(|e| e.to_string())?;
    // The splits' communicators are freed with their handles: the world alone is held.
    if let Communicator::Mpi(mpi) = world {
        // The tag bound was read (and checked at start against kiln's tags, up to 2^25).
        match mpi.largest_tag() {
            Some(largest) if largest >= 1 << 25 => checks += 1,
            other => return Err(format!("MPI_TAG_UB: {other:?}")),
        }
        let held = |what| mpi.communicators_held().map_err(|e| format!("{what}: {e}"));
        let before = held("with the splits")?;
        drop((copies, pipeline));
        let after = held("after dropping them")?;
        if (before, after) != (3, 1) {
            return Err(format!(
                "communicators held: {before} with two splits, {after} after dropping them (want 3, 1)"
            ));
        }
        checks += 1;
    }
    Ok(checks)
}

fn main() -> ExitCode {
    let comm = match MpiCommunicator::world(Duration::from_secs(60)) {
        Ok(comm) => comm,
        Err(err) => {
            eprintln!("mpi_check: {err}");
            return ExitCode::FAILURE;
        }
    };
    let args: Vec<String> = std::env::args().collect();
    // `--local L`: L replicas per process (hybrid backend), each checked in its own thread.
    if let Some(local) = args
        .iter()
        .position(|a| a == "--local")
        .and_then(|i| args.get(i + 1))
        .and_then(|l| l.parse::<usize>().ok())
    {
        let Communicator::Mpi(mpi) = comm else {
            unreachable!("MpiCommunicator::world returns an MPI communicator")
        };
        let results: Vec<(usize, usize, Result<usize, String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = kiln_comm::hybrid_group(mpi, local)
                .into_iter()
                .map(|comm| {
                    scope.spawn(move || (comm.rank(), comm.world_size(), check(&comm, true)))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("replica thread"))
                .collect()
        });
        let mut ok = true;
        for (rank, world, result) in results {
            match result {
                Ok(checks) => println!("rank {rank}/{world} (hybrid): all {checks} checks passed"),
                Err(what) => {
                    eprintln!("rank {rank}/{world} (hybrid): MISMATCH in {what}");
                    ok = false;
                }
            }
        }
        return if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let (rank, world) = (comm.rank(), comm.world_size());
    // `--lose-rank R`: rank R exits at once; the others must not hang in the barrier (the
    // launcher tears the job down), which CI checks with a bounded wait.
    if let Some(lost) = args
        .iter()
        .position(|a| a == "--lose-rank")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse::<usize>().ok())
    {
        if rank == lost {
            eprintln!("rank {rank}: exiting on purpose");
            std::process::exit(3);
        }
        let result = comm.barrier();
        eprintln!("rank {rank}: barrier after losing rank {lost}: {result:?}");
        return ExitCode::FAILURE;
    }
    match check(&comm, true).and_then(|checks| Ok(checks + check_splits(&comm)?)) {
        Ok(checks) => {
            // The same operations through a communication thread.
            let worker = CommWorker::spawn(comm);
            let pending = worker.submit(|c| {
                let mut data = vec![1.0f32; 5];
                c.all_reduce(&mut data, ReduceOp::Sum).map(|_| data)
            });
            match pending.wait() {
                Ok(t) if t.value == vec![world as f32; 5] => {
                    println!("rank {rank}/{world}: all {} checks passed", checks + 1);
                    ExitCode::SUCCESS
                }
                other => {
                    eprintln!("rank {rank}: CommWorker all_reduce failed: {other:?}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(what) => {
            eprintln!("rank {rank}/{world}: MISMATCH in {what}");
            ExitCode::FAILURE
        }
    }
}
