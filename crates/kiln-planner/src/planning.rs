//! A run's planning, for any model: load a saved plan, or profile the model once per device
//! kind (through a cache), weigh the kinds' speeds, measure the interconnect, choose (with
//! the memory lever), and say what was done. The caller brings what only it knows: how to
//! profile its model on a device.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::Device;
use kiln_core::DeviceSpec;

use crate::{
    Fixed, Layout, ModelProfile, Plan, PlanDevice, PlanError, PlanRequest, ProfileKey, TIE_MARGIN,
    Workload, choose_plan_with_lever, measure_interconnect,
};

/// What a run asks the planner.
#[derive(Debug, Clone)]
pub struct RunPlanning {
    /// The model and its configuration (profile cache keys, saved plans).
    pub model: String,
    /// Each device: its name as the user gave it (`cpu:0`, `cuda:1`), its kind and device.
    pub devices: Vec<(String, DeviceSpec, Device)>,
    /// Samples per optimizer step over every device.
    pub global_batch: usize,
    /// What `--plan` asks for.
    pub request: PlanRequest,
    /// The schedule and micro-batches the user fixed, if any.
    pub fixed: Fixed,
    /// Each device's memory limit (see [`parse_memory_limits`](crate::parse_memory_limits)).
    pub memory: Vec<Option<u64>>,
    /// Compute threads of each replica or stage (the profile runs with as many).
    pub threads: usize,
    /// The optimizer, as profile keys name it (its state enters the memory estimate).
    pub optimizer: String,
    /// Optimizer state per parameter byte (1 for SGD with momentum, 2 for Adam's moments).
    pub optimizer_state_factor: f64,
    /// Where profiles are cached (`None`: profiled every run).
    pub profile_cache: Option<PathBuf>,
    /// Profile and predict even when nothing is left to choose (to print the prediction,
    /// or to save the plan).
    pub predict: bool,
}

/// What planning chose, and what it has to say.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The plan; `None` when nothing was left to choose (data parallel on devices of one
    /// kind, equal batches, no memory limit): nothing was profiled then.
    pub plan: Option<Plan>,
    /// Lines for the user: what was loaded or profiled, the plan's table, the runner-up.
    pub notes: Vec<String>,
}

/// How the planner names a device's kind: every `cpu:N` is the one CPU backend.
pub fn device_kind(spec: &DeviceSpec) -> String {
    match spec {
        DeviceSpec::Cpu(_) => "cpu".into(),
        DeviceSpec::Cuda(index) => format!("cuda:{index}"),
        DeviceSpec::Wgpu => "wgpu".into(),
    }
}

impl RunPlanning {
    /// A planning of `model` (its name and configuration, as profile caches and saved plans
    /// key it) on `devices` for `global_batch` samples a step, as `request` asks, with
    /// `threads` compute threads per replica or stage: nothing fixed, no memory limit, no
    /// cache, SGD with momentum's optimizer state. [`PlanOptions::apply`](crate::PlanOptions::apply)
    /// writes a command line's limits, cache and prediction in.
    pub fn new(
        model: impl Into<String>,
        devices: Vec<(String, DeviceSpec, Device)>,
        global_batch: usize,
        request: PlanRequest,
        threads: usize,
    ) -> Self {
        Self {
            model: model.into(),
            devices,
            global_batch,
            request,
            fixed: Fixed::default(),
            memory: Vec::new(),
            threads,
            optimizer: "sgd momentum 0.9".into(),
            optimizer_state_factor: 1.0,
            profile_cache: None,
            predict: false,
        }
    }

    /// The optimizer as profile keys name it, and its state per parameter byte (1 for SGD
    /// with momentum, 2 for Adam's two moments).
    pub fn optimizer(mut self, name: impl Into<String>, state_factor: f64) -> Self {
        self.optimizer = name.into();
        self.optimizer_state_factor = state_factor;
        self
    }

    /// The schedule and micro-batches the user fixed.
    pub fn fixed(mut self, fixed: Fixed) -> Self {
        self.fixed = fixed;
        self
    }

    /// The run's plan. `profile(device, key)` profiles the model on `device` (an inference
    /// device; the profile makes it an autodiff one, with gradient checkpointing when the
    /// key asks) at the key's batch sizes; it runs once per device kind, unless the cache
    /// holds the key already.
    ///
    /// # Errors
    /// A saved plan that is not this run's, a request that cannot be planned, memory that
    /// no plan fits even recomputing activations, a failed profile (a profile cache that
    /// cannot be read or written is a note, and the model is profiled).
    pub fn choose(
        &self,
        mut profile: impl FnMut(&Device, ProfileKey) -> Result<ModelProfile, PlanError>,
    ) -> Result<Planned, PlanError> {
        let mut notes = Vec::new();
        let names: Vec<String> = self.devices.iter().map(|(n, _, _)| n.clone()).collect();
        let n = self.devices.len();
        if let PlanRequest::File(path) = &self.request {
            let plan = self.load(path, &names)?;
            notes.push(format!(
                "planner: loaded {}\n{}",
                path.display(),
                plan.table()
            ));
            return Ok(Planned {
                plan: Some(plan),
                notes,
            });
        }
        let kinds = self.kinds();
        let data_parallel = self.request == PlanRequest::DataParallel || n == 1;
        if data_parallel
            && kinds.len() == 1
            && self.global_batch.is_multiple_of(n)
            && self.memory.iter().all(Option::is_none)
            && !self.predict
        {
            notes.push(format!(
                "planner: data parallel on {n} device(s) of one kind, batches of {}: nothing to choose, nothing profiled",
                self.global_batch / n
            ));
            return Ok(Planned { plan: None, notes });
        }
        let start = Instant::now();
        let per_replica = (self.global_batch / n).max(1);
        let mut batches = vec![(per_replica / 4).max(1), per_replica];
        batches.dedup();
        let (profiles, all_cached) = self.profiles(&kinds, &batches, &mut profile, &mut notes)?;
        let plan_devices = self.plan_devices(&profiles, &kinds[0].0);
        let devices: Vec<Device> = self.devices.iter().map(|(_, _, d)| d.clone()).collect();
        let net = measure_interconnect(n, &devices, 5)?;
        let workload = Workload {
            global_batch: self.global_batch,
            optimizer_state_factor: self.optimizer_state_factor,
        };
        let first = &profiles[&kinds[0].0];
        // The memory lever: where nothing fits, the model profiled again with Burn's gradient
        // checkpointing (activations recomputed in backward instead of kept).
        let mut lever_note = None;
        let recomputing = || {
            lever_note = Some(
                "planner: no plan fits the memory limits; profiled again with gradient checkpointing",
            );
            let key = ProfileKey {
                gradient_checkpointing: true,
                ..first.key.clone()
            };
            profile(&kinds[0].1, key)
        };
        let choice = choose_plan_with_lever(
            first,
            recomputing,
            &plan_devices,
            &net,
            &workload,
            &self.request,
            self.fixed,
        )?;
        // A lever profile (never cached) means this planning measured the model after all.
        let all_cached = all_cached && lever_note.is_none();
        notes.extend(lever_note.map(String::from));
        if choice.chosen.gradient_checkpointing {
            notes.push(format!(
                "planner: {} fits only with gradient checkpointing: Burn recomputes memory-bound activations (element-wise ops) in backward instead of keeping them, for more time per step",
                choice.chosen.summary()
            ));
        }
        let how = if all_cached { "read" } else { "profiled" };
        notes.push(format!(
            "planner: {how} {} segments at batches {batches:?} on {} in {:.1} s, predicted {} plans",
            first.segments(),
            kinds
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            start.elapsed().as_secs_f64(),
            choice.considered
        ));
        notes.push(choice.chosen.table().trim_end().to_string());
        if let Some(other) = &choice.runner_up {
            notes.push(format!(
                "  runner-up: {} at {:.1} ms per step",
                other.summary(),
                other.predicted.step_seconds * 1e3
            ));
        }
        Ok(Planned {
            plan: Some(choice.chosen),
            notes,
        })
    }

    /// A saved plan, checked against this run (model, devices, global batch, fixed schedule
    /// and micro-batches).
    fn load(&self, path: &std::path::Path, names: &[String]) -> Result<Plan, PlanError> {
        let mismatch = |why: String| PlanError::Mismatch(format!("{}: {why}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|err| mismatch(err.to_string()))?;
        let plan = Plan::from_json(&text, &self.model, names)?;
        if plan.global_batch != self.global_batch {
            return Err(mismatch(format!(
                "the plan is for a global batch of {}, this run has {}",
                plan.global_batch, self.global_batch
            )));
        }
        if let Layout::Pipeline {
            schedule,
            micro_batches,
            ..
        } = &plan.layout
        {
            let schedule_differs = self
                .fixed
                .schedule
                .is_some_and(|s| s.to_string() != *schedule);
            let micro_differs = self
                .fixed
                .micro_batches
                .is_some_and(|m| m != *micro_batches);
            if schedule_differs || micro_differs {
                return Err(mismatch(format!(
                    "the plan runs {schedule} with {micro_batches} micro-batches; --schedule and --micro-batches must agree with it or be left out"
                )));
            }
        }
        Ok(plan)
    }

    /// Each distinct device kind, with its first device, in device order.
    fn kinds(&self) -> Vec<(String, Device)> {
        let mut kinds: Vec<(String, Device)> = Vec::new();
        for (_, spec, device) in &self.devices {
            let name = device_kind(spec);
            if !kinds.iter().any(|(k, _)| *k == name) {
                kinds.push((name, device.clone()));
            }
        }
        kinds
    }

    /// The devices as the planner weighs them: slowdowns relative to the first device's
    /// kind (within the tie margin of it they are equal, so that identical devices always
    /// get identical shares) and memory limits.
    fn plan_devices(
        &self,
        profiles: &BTreeMap<String, ModelProfile>,
        reference: &str,
    ) -> Vec<PlanDevice> {
        let busy = |p: &ModelProfile| -> f64 {
            let last = p.batches.last().expect("profiled");
            last.segments
                .iter()
                .map(|s| s.forward_seconds + s.backward_seconds)
                .sum()
        };
        let reference = busy(&profiles[reference]);
        self.devices
            .iter()
            .zip(&self.memory)
            .map(|((name, spec, _), memory)| {
                let ratio = busy(&profiles[&device_kind(spec)]) / reference;
                PlanDevice {
                    name: name.clone(),
                    slowdown: if (ratio - 1.0).abs() <= TIE_MARGIN {
                        1.0
                    } else {
                        ratio
                    },
                    memory: *memory,
                }
            })
            .collect()
    }
}
