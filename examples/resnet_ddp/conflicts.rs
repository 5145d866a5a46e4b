//! Option combinations the example refuses, because one of them would otherwise be
//! silently ignored (or, for `--profile-kernels` on CPU devices, give an empty result:
//! `GpuOptions::check`). The option groups check themselves (`DdpOptions::check`, `PipelineOptions::check`, ...); this
//! file checks them against each other.

use kiln::amp::Precision;
use kiln::planner::PlanRequest;

use crate::args::{Args, CommArg};

/// The options only data-parallel training supports (set ones, by flag name).
pub fn data_parallel_only(args: &Args) -> Vec<&'static str> {
    let mut given = args.ddp.given();
    given.extend(
        [
            (args.comm == CommArg::Mpi, "--comm mpi"),
            (args.step.amp != Precision::F32, "--amp"),
            (args.balance, "--balance"),
            (args.step.accumulation != 1, "--accumulation"),
            (args.step.check_every != 0, "--check-every"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name)),
    );
    given
}

/// Of [`data_parallel_only`], those a pipeline does not take (it takes `--amp`,
/// `--accumulation`, `--check-every` and `--comm mpi`; `auto` still plans them data parallel:
/// the planner profiles f32 steps of one batch).
pub fn pipeline_refuses(args: &Args) -> Vec<&'static str> {
    let takes = ["--amp", "--accumulation", "--check-every", "--comm mpi"];
    let mut refused = data_parallel_only(args);
    refused.retain(|option| !takes.contains(option));
    refused
}

/// Refuses option combinations that would otherwise be silently ignored.
pub fn refuse_conflicts(args: &Args) -> Result<(), String> {
    args.ddp.check().map_err(|e| e.to_string())?;
    args.pipeline.check().map_err(|e| e.to_string())?;
    // A bad --devices is refused with its own message.
    if let Ok(specs) = kiln::core::DeviceSpec::parse_list(&args.devices) {
        args.gpu.check(&specs).map_err(|e| e.to_string())?;
    }
    let refused = pipeline_refuses(args);
    if args.pipeline.pipeline.is_some() {
        args.planner
            .refuse_by_hand("--pipeline")
            .map_err(|e| e.to_string())?;
        if args.gpu.profile_kernels.is_some() {
            return Err("--profile-kernels marks the steady state of data-parallel runs; a pipeline's kernels are not profiled yet".into());
        }
        if !refused.is_empty() {
            return Err(format!(
                "--pipeline does not support {} yet: it trains pipelines in this process",
                refused.join(", ")
            ));
        }
    } else {
        // A pipeline asked of the planner refuses them with its own message.
        args.planner
            .request(&[], &refused)
            .map_err(|e| e.to_string())?;
        let data_parallel = args.planner.plan == PlanRequest::DataParallel
            || (!args.planner.asks_for_a_pipeline() && !data_parallel_only(args).is_empty());
        if data_parallel {
            args.pipeline
                .refuse_in_data_parallel("--plan dp or data-parallel options")
                .map_err(|e| e.to_string())?;
        }
        // MPI runs are data parallel with --batch-size per replica, without the planner.
        let mut planner = args.planner.given();
        planner
            .retain(|&flag| !(flag == "--plan" && args.planner.plan == PlanRequest::DataParallel));
        if args.comm == CommArg::Mpi && !planner.is_empty() {
            return Err(format!(
                "--comm mpi runs data parallel with --batch-size per replica, without the planner (a pipeline across processes is given by hand: --pipeline N, one stage per process): leave out {}",
                planner.join(", ")
            ));
        }
    }
    if args.balance && args.comm == CommArg::Mpi {
        return Err("--balance works with --comm local only".into());
    }
    Ok(())
}
