//! Option combinations the example refuses, because one of them would otherwise be
//! silently ignored (or, for `--profile-kernels` on CPU devices, give an empty result).

use kiln::planner::PlanRequest;

use kiln::amp::Precision;
use kiln::ddp::{Compression, GradientPath};

use crate::args::{Args, CommArg};

/// The options only data-parallel training supports (set ones, by flag name).
pub fn data_parallel_only(args: &Args) -> Vec<&'static str> {
    [
        (args.comm == CommArg::Mpi, "--comm mpi"),
        (args.amp != Precision::F32, "--amp"),
        (args.zero1, "--zero1"),
        (args.local_sgd.is_some(), "--local-sgd"),
        (args.compression != Compression::None, "--compression"),
        (args.sync_bn, "--sync-bn"),
        (args.balance, "--balance"),
        (args.accumulation != 1, "--accumulation"),
        (args.no_overlap, "--no-overlap"),
        (args.bucket_kb != 25 * 1024, "--bucket-kb"),
        (args.gradient_path != GradientPath::Auto, "--gradient-path"),
        (args.check_every != 0, "--check-every"),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| name)
    .collect()
}

fn plan_text(plan: &PlanRequest) -> String {
    match plan {
        PlanRequest::Auto => "auto".into(),
        PlanRequest::DataParallel => "dp".into(),
        PlanRequest::Pipeline(p) => format!("pp={p}"),
        PlanRequest::Hybrid {
            data_parallel,
            stages,
        } => format!("dp={data_parallel},pp={stages}"),
        PlanRequest::File(path) => path.display().to_string(),
    }
}

/// Refuses option combinations that would otherwise be silently ignored.
pub fn refuse_conflicts(args: &Args) -> Result<(), String> {
    // cubecl's profiler times GPU kernels only: a run on CPU devices would leave the file empty.
    let on_a_gpu = kiln::core::DeviceSpec::parse_list(&args.devices)
        .map(|specs| {
            specs
                .iter()
                .any(|s| !matches!(s, kiln::core::DeviceSpec::Cpu(_)))
        })
        .unwrap_or(true); // a bad --devices is refused with its own message
    if args.profile_kernels.is_some() && !on_a_gpu {
        return Err(format!(
            "--profile-kernels times GPU kernels, and --devices {} names none (CPU devices run \
             Burn's and kiln's CPU kernels, which it does not see)",
            args.devices
        ));
    }
    if args.local_sgd.is_some() && args.zero1 {
        return Err(
            "--local-sgd and --zero1 conflict: ZeRO-1 shards the optimizer of a synchronous step"
                .into(),
        );
    }
    if args.local_sgd.is_some() && args.sync_bn {
        return Err(
            "--local-sgd and --sync-bn conflict: synchronised batch norm needs replicas in step"
                .into(),
        );
    }
    let dp_only = data_parallel_only(args);
    // Pipelines also take these; `auto` plans them data parallel (the planner profiles f32
    // steps of one batch).
    let pipeline_unsupported: Vec<&str> = dp_only
        .iter()
        .copied()
        .filter(|o| !["--amp", "--accumulation", "--check-every", "--comm mpi"].contains(o))
        .collect();
    let planned_pipeline = matches!(
        args.plan,
        PlanRequest::Pipeline(_) | PlanRequest::Hybrid { .. }
    );
    if args.pipeline.is_some() {
        if args.plan != PlanRequest::Auto
            || args.global_batch.is_some()
            || args.device_memory.is_some()
            || args.profile_cache.is_some()
            || args.save_plan.is_some()
            || args.predict
        {
            return Err(
                "--pipeline fixes the plan by hand: --plan, --global-batch, --device-memory, --profile-cache, --save-plan and --predict are the planner's (use --plan pp=N instead of --pipeline N to plan)"
                    .into(),
            );
        }
        if args.profile_kernels.is_some() {
            return Err(
                "--profile-kernels marks the steady state of data-parallel runs; a pipeline's kernels are not profiled yet"
                    .into(),
            );
        }
        if !pipeline_unsupported.is_empty() {
            return Err(format!(
                "--pipeline does not support {} yet: it trains pipelines in this process",
                pipeline_unsupported.join(", ")
            ));
        }
    } else {
        if args.data_parallel != 1 || args.split.is_some() {
            return Err(
                "--data-parallel and --split need --pipeline (the planner chooses both: --plan dp=A,pp=B)"
                    .into(),
            );
        }
        if planned_pipeline && !pipeline_unsupported.is_empty() {
            return Err(format!(
                "--plan {} is a pipeline, which does not support {} yet",
                plan_text(&args.plan),
                pipeline_unsupported.join(", ")
            ));
        }
        let pipeline_choices =
            args.show_schedule || args.micro_batches.is_some() || args.schedule.is_some();
        let data_parallel =
            args.plan == PlanRequest::DataParallel || (!planned_pipeline && !dp_only.is_empty());
        if pipeline_choices && data_parallel {
            return Err(
                "--micro-batches, --schedule and --show-schedule describe a pipeline; this run is data parallel (--plan dp or data-parallel options)"
                    .into(),
            );
        }
        if args.comm == CommArg::Mpi
            && (!matches!(args.plan, PlanRequest::Auto | PlanRequest::DataParallel)
                || args.global_batch.is_some()
                || args.device_memory.is_some()
                || args.profile_cache.is_some()
                || args.save_plan.is_some())
        {
            return Err(
                "--comm mpi runs data parallel with --batch-size per replica, without the planner (a pipeline across processes is given by hand: --pipeline N, one stage per process): leave out --plan, --global-batch, --device-memory, --profile-cache and --save-plan"
                    .into(),
            );
        }
    }
    if args.balance && args.comm == CommArg::Mpi {
        return Err("--balance works with --comm local only".into());
    }
    Ok(())
}
