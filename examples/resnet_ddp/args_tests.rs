//! The example's option checks.

use clap::Parser;

use super::Args;
use crate::conflicts::refuse_conflicts;

fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("resnet_ddp").chain(extra.iter().copied()))
}

#[test]
fn out_of_range_values_are_refused_when_parsing() {
    for bad in [
        ["--batch-size", "0"],
        ["--accumulation", "0"],
        ["--prefetch", "0"],
        ["--width", "0"],
        ["--local-sgd", "0"],
        ["--steps", "0"],
        ["--epochs", "0"],
        ["--bucket-kb", "0"],
        ["--threads", "0"],
        ["--clip-grad-norm", "0"],
        ["--clip-grad-norm", "nan"],
        ["--clip-grad-norm", "inf"],
        ["--amp", "fp8"],
        ["--compression", "int8"],
        ["--gradient-path", "disk"],
        ["--comm", "tcp"],
        ["--pipeline", "0"],
        ["--schedule", "zigzag"],
        ["--plan", "fastest"],
        ["--plan", "pp=0"],
        ["--global-batch", "0"],
        ["--threads", "100000"],
        ["--lr", "nan"],
        ["--lr", "inf"],
        ["--lr", "0"],
        ["--autotune-level", "fast"],
        ["--gpu-cache", ""],
        ["--workers", "100000"],
    ] {
        let error = parse(&bad)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} was accepted"));
        assert!(
            error.to_string().contains(bad[0]),
            "{bad:?}: the message names the option: {error}"
        );
    }
    assert!(parse(&["--threads", "1", "--local-sgd", "3"]).is_ok());
    assert!(parse(&["--autotune-level", "minimal", "--gpu-cache", "off"]).is_ok());
}

#[test]
fn options_that_would_be_ignored_are_refused_with_the_reason() {
    let refused = |extra: &[&str], names: &[&str]| {
        let args = parse(extra).expect("parses");
        let message = refuse_conflicts(&args).expect_err("refused");
        for name in names {
            assert!(message.contains(name), "{extra:?}: {message}");
        }
    };
    refused(
        &["--local-sgd", "2", "--zero1"],
        &["--local-sgd", "--zero1"],
    );
    refused(
        &["--local-sgd", "2", "--sync-bn"],
        &["--local-sgd", "--sync-bn"],
    );
    refused(&["--balance", "--comm", "mpi"], &["--balance"]);
    // A kernel profile of a run on CPU devices would stay empty; on a GPU it is taken.
    refused(
        &["--profile-kernels", "k.log"],
        &["--profile-kernels", "--devices cpu"],
    );
    let on_gpu = parse(&["--profile-kernels", "k.log", "--devices", "cuda:0"]).expect("parses");
    assert_eq!(refuse_conflicts(&on_gpu), Ok(()));
    refused(
        &["--pipeline", "2", "--amp", "bf16", "--zero1"],
        &["--pipeline", "--zero1"],
    );
    refused(&["--plan", "dp", "--schedule", "gpipe"], &["--schedule"]);
    refused(&["--zero1", "--micro-batches", "4"], &["--micro-batches"]);
    refused(&["--plan", "pp=2", "--zero1"], &["pp=2", "--zero1"]);
    refused(
        &["--pipeline", "2", "--plan", "dp"],
        &["--pipeline", "--plan"],
    );
    refused(
        &["--data-parallel", "2"],
        &["--data-parallel", "--pipeline"],
    );
    for fine in [
        &["--amp", "bf16"][..],
        // Mixed precision is a mode of the one data-parallel step: every option works.
        &["--amp", "bf16", "--zero1", "--clip-grad-norm", "1.5"],
        &[
            "--pipeline",
            "2",
            "--schedule",
            "interleaved:2",
            "--micro-batches",
            "8",
        ],
        &["--amp", "f16", "--local-sgd", "2", "--bucket-kb", "64"],
        // A pipeline's stages in separate MPI processes.
        &["--pipeline", "2", "--comm", "mpi", "--devices", "cpu"],
        // ... in mixed precision and clipped too (the stages agree over the MPI world).
        &[
            "--pipeline",
            "2",
            "--comm",
            "mpi",
            "--devices",
            "cpu",
            "--amp",
            "f16",
            "--clip-grad-norm",
            "1",
        ],
        // Pipelines train in mixed precision too, by hand or planned.
        &["--pipeline", "2", "--amp", "f16", "--clip-grad-norm", "1"],
        &["--plan", "pp=2", "--amp", "bf16", "--micro-batches", "8"],
        &[
            "--pipeline",
            "2",
            "--data-parallel",
            "2",
            "--accumulation",
            "2",
            "--check-every",
            "5",
        ],
        // The planner: fixed choices for the pipelines it compares, memory limits.
        &["--schedule", "gpipe", "--micro-batches", "8"],
        &["--plan", "dp=2,pp=2", "--device-memory", "1GiB"],
        // Data-parallel options keep `auto` to data parallel (it says so).
        &["--zero1", "--plan", "auto"],
        &[
            "--amp",
            "bf16",
            "--compression",
            "f16",
            "--gradient-path",
            "device",
        ],
        &[
            "--amp",
            "bf16",
            "--no-overlap",
            "--check-every",
            "3",
            "--sync-bn",
        ],
        &["--zero1", "--compression", "bf16", "--bucket-kb", "64"],
        &["--local-sgd", "4", "--accumulation", "2"],
        &[
            "--sync-bn",
            "--gradient-path",
            "device",
            "--check-every",
            "2",
        ],
    ] {
        let args = parse(fine).expect("parses");
        assert!(
            refuse_conflicts(&args).is_ok(),
            "{fine:?} is a valid combination"
        );
    }
}

#[test]
fn launch_takes_the_job_after_a_double_dash() {
    let args = parse(&[
        "launch",
        "--max-restarts",
        "2",
        "--",
        "mpirun",
        "-np",
        "2",
        "x",
        "--resume",
        "latest",
    ])
    .expect("a launch");
    assert_eq!(
        args.command,
        Some(kiln::doctor::Task::Launch(
            kiln::checkpoint::LaunchOptions {
                max_restarts: 2,
                attempt_timeout: None,
                job: ["mpirun", "-np", "2", "x", "--resume", "latest"]
                    .map(String::from)
                    .to_vec(),
            }
        ))
    );
    // The control: no job, nothing to launch; no timeout of zero seconds.
    assert!(parse(&["launch", "--max-restarts", "2"]).is_err());
    assert!(parse(&["launch", "--attempt-timeout", "0", "--", "x"]).is_err());
}

/// An MPI run is data parallel without the planner: its options are refused by name.
#[test]
fn the_planners_options_are_refused_under_mpi() {
    for (extra, names) in [
        (&["--plan", "pp=2"][..], ["--comm mpi", "--plan"]),
        // Its prediction would not be printed.
        (&["--predict"][..], ["--comm mpi", "--predict"]),
    ] {
        let args = parse(&[&["--comm", "mpi"][..], extra].concat()).expect("parses");
        let message = refuse_conflicts(&args).expect_err("refused");
        for name in names {
            assert!(message.contains(name), "{extra:?}: {message}");
        }
    }
    let planless = parse(&["--comm", "mpi", "--plan", "dp"]).expect("parses");
    assert_eq!(refuse_conflicts(&planless), Ok(()));
}
