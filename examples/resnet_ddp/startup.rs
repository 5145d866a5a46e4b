//! Start-up: the GPU runtime's settings from the options, and what to change when a device
//! ran out of memory.

use kiln::core::gpu_runtime::GpuRuntime;

use crate::args::Args;

/// The GPU runtime's settings the options ask for.
pub fn gpu_runtime(args: &Args) -> GpuRuntime {
    GpuRuntime {
        cache: args.gpu_cache.clone(),
        autotune: args.autotune_level,
        kernel_profile: args.profile_kernels.clone(),
    }
}

/// What to change when a device ran out of memory (the failure's text says so).
pub fn out_of_memory_hint(error: &str, placement: &str) -> Option<String> {
    kiln::train::is_out_of_memory(error).then(|| {
        format!(
            "hint: a device ran out of memory ({placement}): lower --batch-size, train with --amp bf16, \
             or give the planner --device-memory SIZE so it picks a plan that fits (a pipeline, \
             gradient checkpointing)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::out_of_memory_hint;

    #[test]
    fn out_of_memory_gets_a_hint_naming_the_placement_and_the_flags() {
        let hint = out_of_memory_hint(
            "replica 0 panicked: Io(OutOfMemory { size: 123 })",
            "--devices cuda:0, batch 128 per replica",
        )
        .expect("a hint");
        assert!(
            hint.contains("cuda:0") && hint.contains("--batch-size"),
            "{hint}"
        );
        assert!(out_of_memory_hint("replica 1 panicked: injected fault at step 10", "x").is_none());
    }
}
