//! Choosing a plan: every data-parallel × pipeline factorisation of the devices and several
//! micro-batch counts, predicted by the cost model; the fastest that fits wins.

use std::path::PathBuf;
use std::str::FromStr;

use kiln_schedule::ScheduleKind;

use crate::PlanError;
use crate::cost::{
    Interconnect, PipelineShape, PlanDevice, Workload, predict_data_parallel, predict_pipeline,
};
use crate::model_profile::ModelProfile;
use crate::plan::{Layout, Plan};

/// Plans within this fraction of the fastest count as equally fast: among them the simplest
/// wins (fewest stages, then fewest micro-batches), so that timing noise between runs cannot
/// flip a choice that does not matter (and with it the arithmetic: batch norm sees
/// micro-batches in a pipeline).
pub const TIE_MARGIN: f64 = 0.05;

/// A fitting data-parallel plan gives way to a pipelined one only when that is predicted
/// this much faster: the two are predicted from profiles at different batch sizes (separate
/// measurements, each with its own noise), and the switch changes the arithmetic (batch norm
/// over micro-batches), so a close call must not flip between runs on identical devices.
pub const DATA_PARALLEL_MARGIN: f64 = 0.15;

/// What `--plan` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanRequest {
    /// The fastest plan that fits.
    Auto,
    /// Data parallel over every device.
    DataParallel,
    /// One pipeline of this many stages (one per device).
    Pipeline(usize),
    /// `data_parallel` pipelines of `stages` stages.
    Hybrid {
        /// Pipelines (D).
        data_parallel: usize,
        /// Stages per pipeline (P).
        stages: usize,
    },
    /// A plan saved as JSON.
    File(PathBuf),
}

impl FromStr for PlanRequest {
    type Err = PlanError;

    /// `auto`, `dp`, `pp=N`, `dp=A,pp=B`, or a path to a plan's JSON (ending in `.json`).
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let number = |text: &str, what: &str| -> Result<usize, PlanError> {
            text.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    PlanError::Request(format!("`{input}`: {what} must be a positive number"))
                })
        };
        let lower = input.trim().to_ascii_lowercase();
        match lower.as_str() {
            "auto" => return Ok(Self::Auto),
            "dp" => return Ok(Self::DataParallel),
            _ => {}
        }
        if let Some(stages) = lower.strip_prefix("pp=") {
            return Ok(Self::Pipeline(number(stages, "the stage count")?));
        }
        if let Some(rest) = lower.strip_prefix("dp=")
            && let Some((dp, pp)) = rest.split_once(",pp=")
        {
            return Ok(Self::Hybrid {
                data_parallel: number(dp, "the pipeline count")?,
                stages: number(pp, "the stage count")?,
            });
        }
        if lower.ends_with(".json") {
            return Ok(Self::File(PathBuf::from(input.trim())));
        }
        Err(PlanError::Request(format!(
            "`{input}` is not a plan: use auto, dp, pp=N, dp=A,pp=B or a plan's .json file"
        )))
    }
}

impl std::fmt::Display for PlanRequest {
    /// As `--plan` takes it: `auto`, `dp`, `pp=N`, `dp=A,pp=B` or the plan file's path.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::DataParallel => f.write_str("dp"),
            Self::Pipeline(stages) => write!(f, "pp={stages}"),
            Self::Hybrid {
                data_parallel,
                stages,
            } => write!(f, "dp={data_parallel},pp={stages}"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Choices the user fixed; the planner makes the others.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Fixed {
    /// The schedule (`--schedule`); else 1F1B (GPipe's step takes as long and holds more).
    pub schedule: Option<ScheduleKind>,
    /// Micro-batches per batch (`--micro-batches`); else P, 2P and 4P are compared.
    pub micro_batches: Option<usize>,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanChoice {
    /// The plan to run.
    pub chosen: Plan,
    /// The best plan of another shape, if any fits (shown beside the choice).
    pub runner_up: Option<Plan>,
    /// Plans predicted (fitting or not).
    pub considered: usize,
}

/// [`choose_plan`] with the memory lever: when no plan fits the devices' memory as the model
/// is, plans again on the profile `recomputing` takes — the model on an autodiff device with
/// Burn's gradient checkpointing, which recomputes memory-bound activations in backward
/// instead of keeping them — and returns what fits there, marked
/// ([`Plan::gradient_checkpointing`]; its prediction is that profile's). `recomputing` runs
/// only then: the lever costs time, so a plan that fits without it is always preferred.
///
/// # Errors
/// As [`choose_plan`]; [`PlanError::EvenRecomputing`] when nothing fits either way (both
/// reasons given), [`PlanError::Profile`] when the second profile fails.
pub fn choose_plan_with_lever(
    profile: &ModelProfile,
    recomputing: impl FnOnce() -> Result<ModelProfile, PlanError>,
    devices: &[PlanDevice],
    net: &Interconnect,
    workload: &Workload,
    request: &PlanRequest,
    fixed: Fixed,
) -> Result<PlanChoice, PlanError> {
    match choose_plan(profile, devices, net, workload, request, fixed) {
        Err(plain) if plain.is_memory() => {
            let lever = recomputing()?;
            if !lever.key.gradient_checkpointing {
                return Err(PlanError::Request(
                    "the memory lever's profile was not taken with gradient checkpointing".into(),
                ));
            }
            choose_plan(&lever, devices, net, workload, request, fixed).map_err(|recomputing| {
                PlanError::EvenRecomputing {
                    plain: Box::new(plain),
                    recomputing: Box::new(recomputing),
                }
            })
        }
        other => other,
    }
}

/// Predicts every plan `request` allows on `devices` and picks one: the fastest that fits
/// each device's memory, where a fitting data-parallel plan stays unless a pipeline is more
/// than [`DATA_PARALLEL_MARGIN`] faster, and plans within [`TIE_MARGIN`] of the fastest
/// count as ties won by the simplest. A forced shape (`dp`, `pp=N`, `dp=A,pp=B`) still compares micro-batch counts
/// unless `fixed` names one.
///
/// # Errors
/// [`PlanError::Request`] for a shape the devices cannot take ([`PlanRequest::File`] is
/// the caller's to load); [`PlanError::Unmeasured`] when a memory limit is set but the
/// profile has no activation sizes; [`PlanError::ForcedDoesNotFit`] for a forced shape
/// that fits nowhere; [`PlanError::DoesNotFit`] when nothing fits.
pub fn choose_plan(
    profile: &ModelProfile,
    devices: &[PlanDevice],
    net: &Interconnect,
    workload: &Workload,
    request: &PlanRequest,
    fixed: Fixed,
) -> Result<PlanChoice, PlanError> {
    if devices.is_empty() {
        return Err(PlanError::Request("no devices to plan for".into()));
    }
    check_measured(profile, devices)?;
    let shapes = shapes(profile, devices.len(), request)?;
    let mut tally = Tally::default();
    for (d, p) in shapes {
        predict_shape(profile, devices, net, workload, fixed, (d, p), &mut tally);
    }
    if tally.plans.is_empty() {
        let forced = !matches!(request, PlanRequest::Auto);
        return Err(nothing_fits(
            profile,
            devices,
            workload,
            forced,
            tally.last_error,
        ));
    }
    let (chosen, runner_up) = pick(tally.plans);
    Ok(PlanChoice {
        chosen,
        runner_up,
        considered: tally.considered,
    })
}

/// Memory limits can only be checked against measured activations: a profile without them
/// would make every plan look as if it fit.
///
/// # Errors
/// [`PlanError::Unmeasured`] when a device has a limit and a segment no activation size.
fn check_measured(profile: &ModelProfile, devices: &[PlanDevice]) -> Result<(), PlanError> {
    let limited = devices.iter().any(|d| d.memory.is_some());
    let measured = profile
        .batches
        .iter()
        .all(|b| b.segments.iter().all(|s| s.activation_bytes.is_some()));
    if limited && !measured {
        return Err(PlanError::Unmeasured);
    }
    Ok(())
}

/// The (pipelines, stages per pipeline) shapes `request` allows on `n` devices: for
/// [`PlanRequest::Auto`] every factorisation with no more stages than segments.
///
/// # Errors
/// [`PlanError::Request`] for a plan file, or a stage count that does not divide `n`.
fn shapes(
    profile: &ModelProfile,
    n: usize,
    request: &PlanRequest,
) -> Result<Vec<(usize, usize)>, PlanError> {
    let shapes: Vec<(usize, usize)> = match request {
        PlanRequest::Auto => (1..=n)
            .filter(|&d| n.is_multiple_of(d))
            .map(|d| (d, n / d))
            .filter(|&(_, p)| p <= profile.segments())
            .collect(),
        PlanRequest::DataParallel => vec![(n, 1)],
        PlanRequest::Pipeline(p) => vec![(n / p, *p)],
        PlanRequest::Hybrid {
            data_parallel,
            stages,
        } => vec![(*data_parallel, *stages)],
        PlanRequest::File(path) => {
            return Err(PlanError::Request(format!(
                "{} is a plan file: load it with Plan::from_json",
                path.display()
            )));
        }
    };
    if let PlanRequest::Pipeline(p) | PlanRequest::Hybrid { stages: p, .. } = request
        && shapes[0].0 * p != n
    {
        return Err(PlanError::Request(format!(
            "{p} stages per pipeline need a multiple of {p} devices, there are {n}"
        )));
    }
    Ok(shapes)
}

/// Predicts the plans of shape `(d, p)` into `tally`: one data-parallel plan when `p` is 1
/// and no schedule is fixed, else a pipeline per micro-batch count compared (P, 2P and 4P
/// that the batch allows, or the one `fixed` names).
fn predict_shape(
    profile: &ModelProfile,
    devices: &[PlanDevice],
    net: &Interconnect,
    workload: &Workload,
    fixed: Fixed,
    (d, p): (usize, usize),
    tally: &mut Tally,
) {
    if p == 1 && fixed.schedule.is_none() {
        tally.record(
            predict_data_parallel(profile, devices, net, workload),
            devices,
        );
        return;
    }
    let batch = workload.global_batch / d;
    let counts: Vec<usize> = match fixed.micro_batches {
        Some(m) => vec![m],
        None => [p, 2 * p, 4 * p]
            .into_iter()
            .filter(|&m| m <= batch)
            .collect(),
    };
    if counts.is_empty() {
        tally.unplannable(PlanError::Request(format!(
            "a batch of {batch} per pipeline cannot be cut into {p} or more micro-batches (one per stage at least)"
        )));
    }
    let schedule = fixed.schedule.unwrap_or(ScheduleKind::OneFOneB);
    for m in counts {
        let shape = PipelineShape {
            data_parallel: d,
            stages: p,
            micro_batches: m,
            schedule,
        };
        let attempt = predict_pipeline(profile, devices, net, workload, shape);
        tally.record(attempt, devices);
    }
}

/// What the predictions came to: the plans that fit, how many were predicted, and the
/// error to report if nothing fits, with how far its plan is from fitting (requests that
/// cannot be planned first).
#[derive(Default)]
struct Tally {
    plans: Vec<Plan>,
    considered: usize,
    last_error: Option<(f64, PlanError)>,
}

impl Tally {
    /// Keeps a plan that fits; of the plans that do not, the one closest to fitting explains
    /// best, so its error is kept.
    fn record(&mut self, attempt: Result<Plan, PlanError>, devices: &[PlanDevice]) {
        self.considered += 1;
        let (ratio, err) = match attempt {
            Ok(plan) => match overflow(&plan, devices) {
                None => {
                    self.plans.push(plan);
                    return;
                }
                Some(details) => {
                    let ratio = worst_ratio(
                        plan.predicted.device_bytes.iter().copied(),
                        devices.iter().map(|d| d.memory),
                    );
                    let summary = plan.summary();
                    (
                        ratio,
                        PlanError::ForcedDoesNotFit {
                            plan: summary,
                            details,
                        },
                    )
                }
            },
            Err(err) => (error_ratio(&err), err),
        };
        if self
            .last_error
            .as_ref()
            .is_none_or(|(best, _)| ratio < *best)
        {
            self.last_error = Some((ratio, err));
        }
    }

    /// A shape that cannot be planned at all: its error replaces any kept so far and no
    /// plan's error replaces it, as a request that cannot be planned explains before any
    /// memory shortfall.
    fn unplannable(&mut self, err: PlanError) {
        self.last_error = Some((f64::NEG_INFINITY, err));
    }
}

/// How far a failed prediction is from fitting: the worst stage's bytes ÷ limit when no
/// split fits, else infinitely far (the error is not about memory).
fn error_ratio(err: &PlanError) -> f64 {
    match err {
        PlanError::NoSplitFits {
            stage_bytes,
            limits,
        } => worst_ratio(stage_bytes.iter().map(|&b| Some(b)), limits.iter().copied()),
        _ => f64::INFINITY,
    }
}

/// The error when no plan fits: a forced shape's own, or a request that cannot be planned;
/// else a segment too large for every device says why best, and when each one fits some
/// device, the plan closest to fitting says what it lacks.
fn nothing_fits(
    profile: &ModelProfile,
    devices: &[PlanDevice],
    workload: &Workload,
    forced: bool,
    last_error: Option<(f64, PlanError)>,
) -> PlanError {
    match (forced, last_error.map(|(_, err)| err)) {
        (true, Some(err)) => err,
        (_, Some(err @ PlanError::Request(_))) => err,
        (_, last) => match (does_not_fit(profile, devices, workload), last) {
            (
                PlanError::DoesNotFit {
                    segment_bytes,
                    largest_device,
                    ..
                },
                Some(tried),
            ) if segment_bytes <= largest_device => tried,
            (err, _) => err,
        },
    }
}

/// The plan to run among fitting `plans`, and the best of another shape. A fitting
/// data-parallel plan is kept unless a pipelined one is predicted more than
/// [`DATA_PARALLEL_MARGIN`] faster; among the rest, plans within [`TIE_MARGIN`] of the
/// fastest are ties won by the simplest.
///
/// # Panics
/// If `plans` is empty.
pub(crate) fn pick(mut plans: Vec<Plan>) -> (Plan, Option<Plan>) {
    let time = |p: &Plan| p.predicted.step_seconds;
    let fastest = plans.iter().map(time).fold(f64::INFINITY, f64::min);
    let data_parallel = plans
        .iter()
        .position(|p| matches!(p.layout, Layout::DataParallel { .. }))
        .filter(|&i| time(&plans[i]) <= fastest * (1.0 + DATA_PARALLEL_MARGIN));
    let chosen_index = data_parallel.unwrap_or_else(|| {
        (0..plans.len())
            .filter(|&i| time(&plans[i]) <= fastest * (1.0 + TIE_MARGIN))
            .min_by_key(|&i| simplicity(&plans[i]))
            .expect("the fastest plan is within the margin")
    });
    let chosen = plans.remove(chosen_index);
    let shape = |p: &Plan| p.summary().split(' ').next().map(str::to_owned);
    let runner_up = plans
        .into_iter()
        .filter(|p| shape(p) != shape(&chosen))
        .min_by(|a, b| time(a).total_cmp(&time(b)));
    (chosen, runner_up)
}

/// Ordering among near-equal plans: fewer stages, then fewer micro-batches.
fn simplicity(plan: &Plan) -> (usize, usize) {
    match &plan.layout {
        Layout::DataParallel { .. } => (1, 0),
        Layout::Pipeline {
            stages,
            micro_batches,
            ..
        } => (*stages, *micro_batches),
    }
}

/// The largest bytes ÷ limit over devices (unmeasured or unlimited ones count 0).
fn worst_ratio(
    bytes: impl Iterator<Item = Option<u64>>,
    limits: impl Iterator<Item = Option<u64>>,
) -> f64 {
    bytes
        .zip(limits)
        .filter_map(|(bytes, limit)| Some(bytes? as f64 / limit?.max(1) as f64))
        .fold(0.0, f64::max)
}

/// The devices whose predicted bytes exceed their limit, described; `None` if all fit.
fn overflow(plan: &Plan, devices: &[PlanDevice]) -> Option<String> {
    let over: Vec<String> = devices
        .iter()
        .zip(&plan.predicted.device_bytes)
        .filter_map(|(device, bytes)| match (device.memory, bytes) {
            (Some(limit), Some(bytes)) if *bytes > limit => Some(format!(
                "{} needs {} of its {}",
                device.name,
                crate::partition::human_bytes(*bytes),
                crate::partition::human_bytes(limit)
            )),
            _ => None,
        })
        .collect();
    (!over.is_empty()).then(|| over.join("; "))
}

/// Nothing fits: the segment that needs the most memory on its own (its state and one
/// micro-batch of the finest plan compared), against the largest device.
fn does_not_fit(profile: &ModelProfile, devices: &[PlanDevice], workload: &Workload) -> PlanError {
    let micro = (workload.global_batch / (4 * devices.len())).max(1);
    let bytes: Vec<u64> = profile
        .at(micro)
        .iter()
        .map(|s| crate::cost::state_bytes(s, workload) + s.activation_bytes.unwrap_or(0))
        .collect();
    let names = profile.segment_names();
    crate::partition::largest_segment(&bytes, devices.iter().map(|d| d.memory), |i| {
        names.get(i).cloned().unwrap_or_default()
    })
}
