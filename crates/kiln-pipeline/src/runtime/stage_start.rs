//! A stage thread's start: its own pool, its share of the model (resumed from a checkpoint
//! when asked), its optimizer and gradient rule, then its steps.

use std::ops::Range;
use std::path::PathBuf;

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use crossbeam_channel::{Receiver, Sender};
use kiln_checkpoint::{RunIdentity, resume_owning};
use kiln_core::{MemoryAccount, Segmented, panic_message};
use kiln_train::{MeanGradient, Objective};

use crate::runtime::mailbox::Abort;
use crate::runtime::stage::{Stage, held_infos};
use crate::runtime::tied::stage_ties;
use crate::runtime::worker::{Links, StepData, StepDone, Update, run_stage};
use crate::runtime::{PipelineConfig, PipelineError};
use crate::schedule::Schedule;

/// What a stage thread needs to build and run its stage (for objective `J`).
pub(crate) struct StageStart<'a, B, O, H, J: Objective> {
    pub(crate) index: usize,
    pub(crate) device: Device,
    pub(crate) threads: usize,
    /// Whether the pool's idle threads poll for work (`kiln_core::warm_pool`).
    pub(crate) warm: bool,
    pub(crate) build: &'a B,
    pub(crate) optimizer: &'a O,
    pub(crate) objective: &'a J,
    pub(crate) config: &'a PipelineConfig,
    pub(crate) plan: &'a Schedule,
    pub(crate) links: Links<'a, H>,
    pub(crate) resume: Option<&'a (PathBuf, RunIdentity)>,
    pub(crate) steps: Receiver<StepData<J::Batch>>,
    pub(crate) done: Sender<StepDone>,
    pub(crate) abort: Abort,
}

impl<B, O, M, J> StageStart<'_, B, O, M::Hidden, J>
where
    J: Objective,
    M: Segmented<Input = J::Input, Output = J::Output> + 'static,
    B: Fn(&Device) -> M + Sync,
    O: Fn() -> ModuleOptimizer + Sync,
{
    /// The stage thread's life: its own pool, its share of the model, its steps. A failure
    /// (an error or a panic) raises the abort flag, so that its peers stop waiting at once.
    pub(crate) fn run(self) -> Result<Stage<M>, PipelineError> {
        let index = self.index;
        let abort = self.abort.clone();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.build_and_train()))
                .unwrap_or_else(|panic| {
                    Err(PipelineError::Stage {
                        stage: index,
                        message: panic_message(&*panic),
                    })
                });
        if result.is_err() {
            abort.raise();
        }
        result
    }

    fn build_and_train(self) -> Result<Stage<M>, PipelineError> {
        let index = self.index;
        // What the stage's threads allocate, for its peak memory on a CPU device (an
        // accelerator keeps its tensors in its own pool, which this does not see).
        let account = self
            .device
            .memory_pool_usage()
            .is_none()
            .then(MemoryAccount::open)
            .flatten();
        let _charging = account.as_ref().map(MemoryAccount::charge);
        let charged = account.as_ref().map(MemoryAccount::id);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads)
            .thread_name(move |i| format!("kiln-stage-{index}-compute-{i}"))
            .start_handler(move |_| {
                if let Some(id) = charged {
                    id.charge_this_thread();
                }
            })
            .build()
            .map_err(|err| PipelineError::Stage {
                stage: index,
                message: err.to_string(),
            })?;
        kiln_core::install_warm(&pool, self.warm, || {
            // Every stage derives the same split from its own build: no full model is
            // built anywhere else.
            let model = (self.build)(&self.device);
            let stages = self.plan.stages();
            let split = self
                .config
                .segments_per_virtual_stage(model.segments().len(), stages)?;
            let mut ranges = chunk_ranges(&split, self.plan);
            #[allow(unused_mut)] // the tests' control changes it
            let mut ties = stage_ties(&model, &ranges, index);
            #[cfg(test)]
            {
                ties.sum_off = self.config.tied_sum_off;
            }
            let chunks = ranges.swap_remove(index);
            let mut optimizer = (self.optimizer)();
            let mut step_state = kiln_train::StepState::Null;
            // Resumed: the checkpoint's parameters, and the optimizer state of the stage's own.
            let model = match self.resume {
                None => model,
                Some((path, identity)) => {
                    // Its copies of tied parameters too: their optimizer state is the owner's.
                    let owned: Vec<String> = held_infos(&model, &chunks, &ties)
                        .into_iter()
                        .filter(|info| info.trainable)
                        .map(|info| info.path)
                        .collect();
                    let resumed = resume_owning(path, identity, model, optimizer, &owned)
                        .map_err(PipelineError::checkpoint)?;
                    optimizer = resumed.optimizer;
                    step_state = resumed.step_state;
                    resumed.model
                }
            };
            let mut stage = Stage::new(model, chunks, ties);
            stage.emulated_slowdown = self
                .config
                .emulated_slowdown
                .get(index)
                .copied()
                .unwrap_or(1.0);
            let mut rule = MeanGradient::new(self.config.precision.clone());
            if let Some(norm) = self.config.max_grad_norm {
                rule = rule
                    .with_max_norm(norm)
                    .map_err(|err| PipelineError::Config(err.to_string()))?;
            }
            // The loss scaler continues where the checkpoint left it.
            rule.restore_state(&step_state)
                .map_err(PipelineError::checkpoint)?;
            let update = Update { optimizer, rule };
            // The peak of the steps, not of the build (which makes the whole model first).
            if let Some(account) = &account {
                account.reset_peak();
            }
            let mut stage = run_stage(
                index,
                stage,
                (self.plan, self.objective),
                update,
                self.links,
                self.steps,
                self.done,
            )?;
            stage.peak_bytes = account.as_ref().map(MemoryAccount::peak_bytes);
            Ok(stage)
        })
    }
}

/// Segment ranges of each stage's chunks, from the segments per virtual stage.
fn chunk_ranges(split: &[usize], plan: &Schedule) -> Vec<Vec<Range<usize>>> {
    let mut starts = Vec::with_capacity(split.len());
    let mut next = 0;
    for count in split {
        starts.push(next..next + count);
        next += count;
    }
    (0..plan.stages())
        .map(|stage| {
            (0..plan.chunks())
                .map(|chunk| starts[plan.virtual_stage(stage, chunk)].clone())
                .collect()
        })
        .collect()
}
