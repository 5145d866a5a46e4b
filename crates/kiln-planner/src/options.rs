//! The planner's options of a training command — the plan asked for, the global batch, each
//! device's memory, the profile cache, predicting anyway, saving the plan — checked against
//! the run's other options and written into a [`RunPlanning`]. With the `clap` feature they
//! flatten into a command line: `#[command(flatten)] planner: PlanOptions`.

use std::path::PathBuf;

use crate::{Plan, PlanError, PlanRequest, ProfileCacheChoice, RunPlanning, parse_memory_limits};

/// The planner's options (the field names are the flags' names).
///
/// ```
/// use kiln_planner::{PlanOptions, PlanRequest};
///
/// let options = PlanOptions { device_memory: Some("2GiB".into()), ..PlanOptions::default() };
/// // `--amp` makes `auto` compare data-parallel plans only (the planner profiles f32 steps).
/// let (request, note) = options.request(&["--amp"], &[])?;
/// assert_eq!(request, PlanRequest::DataParallel);
/// assert!(note.unwrap().contains("--amp"));
/// assert!(options.refuse_by_hand("--pipeline").unwrap_err().to_string().contains("--device-memory"));
/// # Ok::<(), kiln_planner::PlanError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct PlanOptions {
    /// How to use the devices: `auto` (profile the model, predict every data-parallel,
    /// pipeline and hybrid plan, train with the fastest that fits), `dp`, `pp=N` (one
    /// pipeline of N stages), `dp=A,pp=B` (A pipelines of B stages), or a plan saved with
    /// --save-plan (`plan.json`). Every plan keeps the global batch (--global-batch).
    #[cfg_attr(feature = "clap", arg(long, default_value = "auto"))]
    pub plan: PlanRequest,
    /// Samples per optimizer step over all devices, the same for every plan compared
    /// (default: the command's batch per device x devices).
    #[cfg_attr(feature = "clap", arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub global_batch: Option<usize>,
    /// Memory each device may use, for the planner: one size for all (`2GiB`, `512MB`) or
    /// per device (`cpu:0=2GiB,cpu:1=1GiB`). Default: no limit.
    #[cfg_attr(feature = "clap", arg(long))]
    pub device_memory: Option<String>,
    /// Where the planner keeps its profiles, reused when the model, batch sizes, device, host
    /// (CPU, vector instructions, build), threads and kiln version match: `default` (the per-user cache,
    /// ~/.cache/kiln/planner-profiles on Linux), `off` (profile every run) or a directory.
    #[cfg_attr(feature = "clap", arg(long, default_value = "default"))]
    pub profile_cache: ProfileCacheChoice,
    /// Profile the model and predict the step even when nothing is left to choose (data
    /// parallel on identical devices with equal batches, where the planner skips profiling).
    #[cfg_attr(feature = "clap", arg(long))]
    pub predict: bool,
    /// Write the chosen plan as JSON here (load it back with --plan FILE.json).
    #[cfg_attr(feature = "clap", arg(long))]
    pub save_plan: Option<PathBuf>,
}

impl Default for PlanOptions {
    /// `auto`, the per-user profile cache, nothing else given.
    fn default() -> Self {
        Self {
            plan: PlanRequest::Auto,
            global_batch: None,
            device_memory: None,
            profile_cache: ProfileCacheChoice::PerUser,
            predict: false,
            save_plan: None,
        }
    }
}

impl PlanOptions {
    /// The planner's flags given, by name (`--plan` when not `auto`).
    pub fn given(&self) -> Vec<&'static str> {
        [
            (self.plan != PlanRequest::Auto, "--plan"),
            (self.global_batch.is_some(), "--global-batch"),
            (self.device_memory.is_some(), "--device-memory"),
            (
                self.profile_cache != ProfileCacheChoice::PerUser,
                "--profile-cache",
            ),
            (self.predict, "--predict"),
            (self.save_plan.is_some(), "--save-plan"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }

    /// Whether `--plan` asks for a pipeline (`pp=N` or `dp=A,pp=B`).
    pub fn asks_for_a_pipeline(&self) -> bool {
        matches!(
            self.plan,
            PlanRequest::Pipeline(_) | PlanRequest::Hybrid { .. }
        )
    }

    /// Refuses every planner option beside `flag`, which fixes the plan by hand (each would
    /// be ignored).
    ///
    /// # Errors
    /// [`PlanError::Request`], naming the options given.
    pub fn refuse_by_hand(&self, flag: &str) -> Result<(), PlanError> {
        let given = self.given();
        if given.is_empty() {
            return Ok(());
        }
        Err(PlanError::Request(format!(
            "{flag} fixes the plan by hand, and {} {} the planner's (--plan pp=N plans a pipeline)",
            given.join(", "),
            if given.len() == 1 { "is" } else { "are" }
        )))
    }

    /// What to ask the planner, with a note for the user when `auto` was narrowed: the
    /// options in `data_parallel_only` (given flags only data parallelism honours) make `auto`
    /// compare data-parallel plans only, and a pipeline asked for by `--plan` refuses those
    /// in `pipeline_refuses`.
    ///
    /// # Errors
    /// [`PlanError::Request`] for a pipeline asked for with options it does not support.
    pub fn request(
        &self,
        data_parallel_only: &[&str],
        pipeline_refuses: &[&str],
    ) -> Result<(PlanRequest, Option<String>), PlanError> {
        if self.asks_for_a_pipeline() && !pipeline_refuses.is_empty() {
            return Err(PlanError::Request(format!(
                "--plan {} is a pipeline, which does not support {}",
                self.plan,
                pipeline_refuses.join(", ")
            )));
        }
        if self.plan == PlanRequest::Auto && !data_parallel_only.is_empty() {
            let note = format!(
                "planner: comparing data-parallel plans only ({} need data parallelism)",
                data_parallel_only.join(", ")
            );
            return Ok((PlanRequest::DataParallel, Some(note)));
        }
        Ok((self.plan.clone(), None))
    }

    /// `planning` with these options written in: the global batch (when given), each
    /// device's memory, the cache, and predicting (also to save the plan). The request is the
    /// caller's ([`request`](Self::request)).
    ///
    /// # Errors
    /// [`PlanError::Request`] for a `--device-memory` that does not parse or names a device
    /// the run does not have.
    pub fn apply(&self, planning: RunPlanning) -> Result<RunPlanning, PlanError> {
        let names: Vec<String> = planning.devices.iter().map(|(n, _, _)| n.clone()).collect();
        Ok(RunPlanning {
            global_batch: self.global_batch.unwrap_or(planning.global_batch),
            memory: parse_memory_limits(self.device_memory.as_deref(), &names)?,
            profile_cache: self.profile_cache.directory(),
            predict: self.predict || self.save_plan.is_some(),
            ..planning
        })
    }

    /// Writes `plan` where `--save-plan` says, returning the line that says so (`None`
    /// without `--save-plan` or a plan).
    ///
    /// # Errors
    /// [`PlanError::Request`] when the file cannot be written.
    pub fn save(&self, plan: Option<&Plan>) -> Result<Option<String>, PlanError> {
        let (Some(path), Some(plan)) = (&self.save_plan, plan) else {
            return Ok(None);
        };
        std::fs::write(path, plan.to_json())
            .map_err(|err| PlanError::Request(format!("--save-plan {}: {err}", path.display())))?;
        Ok(Some(format!("planner: plan saved to {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use kiln_core::DeviceSpec;

    use super::*;
    use crate::{Layout, Predicted};

    fn two_cpus() -> RunPlanning {
        let device = |name: &str| {
            (
                name.to_string(),
                DeviceSpec::Cpu(0),
                burn::tensor::Device::flex(),
            )
        };
        RunPlanning {
            model: "m".into(),
            devices: vec![device("cpu:0"), device("cpu:1")],
            global_batch: 64,
            request: PlanRequest::Auto,
            fixed: crate::Fixed::default(),
            memory: vec![None, None],
            threads: 1,
            optimizer: "sgd".into(),
            optimizer_state_factor: 1.0,
            profile_cache: None,
            predict: false,
        }
    }

    #[test]
    fn the_options_reach_the_planning_and_are_named_when_given() {
        let options = PlanOptions {
            plan: PlanRequest::Pipeline(2),
            global_batch: Some(96),
            device_memory: Some("cpu:1=1GiB".into()),
            profile_cache: ProfileCacheChoice::Directory("cache".into()),
            predict: false,
            save_plan: Some("plan.json".into()),
        };
        let planning = options.apply(two_cpus()).unwrap();
        assert_eq!(planning.global_batch, 96);
        assert_eq!(planning.memory, vec![None, Some(1 << 30)]);
        assert_eq!(planning.profile_cache, Some(PathBuf::from("cache")));
        assert!(planning.predict, "saving a plan predicts it");
        assert_eq!(planning.threads, 1, "the caller's fields stay");
        assert_eq!(options.given().len(), 5, "{:?}", options.given());
        assert!(PlanOptions::default().given().is_empty());
        let per_user = PlanOptions::default().apply(two_cpus()).unwrap();
        assert_eq!(
            per_user.profile_cache,
            ProfileCacheChoice::per_user_directory(),
            "profiles are cached per user unless told otherwise"
        );
        let off = PlanOptions {
            profile_cache: ProfileCacheChoice::Off,
            ..PlanOptions::default()
        };
        assert_eq!(off.apply(two_cpus()).unwrap().profile_cache, None);
        assert_eq!(off.given(), ["--profile-cache"]);
        assert_eq!(
            PlanOptions::default()
                .apply(two_cpus())
                .unwrap()
                .global_batch,
            64
        );
        let unknown = PlanOptions {
            device_memory: Some("cuda:3=1GiB".into()),
            ..PlanOptions::default()
        };
        assert!(unknown.apply(two_cpus()).is_err());
    }

    #[test]
    fn auto_narrows_to_data_parallel_and_a_pipeline_refuses_what_it_cannot_do() {
        let auto = PlanOptions::default();
        assert_eq!(auto.request(&[], &[]).unwrap(), (PlanRequest::Auto, None));
        let (request, note) = auto.request(&["--zero1"], &["--zero1"]).unwrap();
        assert_eq!(request, PlanRequest::DataParallel);
        assert!(note.unwrap().contains("--zero1"));
        let hybrid = PlanOptions {
            plan: PlanRequest::Hybrid {
                data_parallel: 2,
                stages: 2,
            },
            ..PlanOptions::default()
        };
        let err = hybrid.request(&["--zero1"], &["--zero1"]).unwrap_err();
        assert!(
            err.to_string().contains("--plan dp=2,pp=2 is a pipeline")
                && err.to_string().contains("--zero1"),
            "{err}"
        );
        assert!(
            hybrid.request(&["--amp"], &[]).is_ok(),
            "a pipeline takes --amp"
        );
        assert!(auto.refuse_by_hand("--pipeline").is_ok());
        let err = hybrid.refuse_by_hand("--pipeline").unwrap_err().to_string();
        assert!(
            err.contains("--pipeline fixes the plan by hand, and --plan is"),
            "{err}"
        );
    }

    #[test]
    fn a_saved_plan_loads_back() {
        let dir = std::env::temp_dir().join(format!("kiln-plan-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plan.json");
        let plan = Plan {
            model: "m".into(),
            devices: vec!["cpu:0".into(), "cpu:1".into()],
            global_batch: 64,
            segment_names: vec!["a".into()],
            layout: Layout::DataParallel {
                batches: vec![32, 32],
            },
            predicted: Predicted {
                step_seconds: 0.5,
                device_bytes: vec![None, None],
                exposed_communication_seconds: 0.0,
                bubble_fraction: 0.0,
            },
            gradient_checkpointing: false,
        };
        let options = PlanOptions {
            save_plan: Some(path.clone()),
            ..PlanOptions::default()
        };
        assert_eq!(PlanOptions::default().save(Some(&plan)).unwrap(), None);
        assert_eq!(options.save(None).unwrap(), None);
        let note = options.save(Some(&plan)).unwrap().expect("saved");
        assert!(note.contains("plan.json"), "{note}");
        let text = std::fs::read_to_string(&path).unwrap();
        let names = ["cpu:0".to_string(), "cpu:1".to_string()];
        assert_eq!(Plan::from_json(&text, "m", &names).unwrap(), plan);
        std::fs::remove_dir_all(&dir).ok();
        let nowhere = PlanOptions {
            save_plan: Some(dir.join("missing").join("plan.json")),
            ..PlanOptions::default()
        };
        assert!(nowhere.save(Some(&plan)).is_err());
    }

    #[cfg(feature = "clap")]
    #[test]
    fn the_flags_parse_into_the_options() {
        use clap::Parser;
        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            planner: PlanOptions,
        }
        let parsed = Command::try_parse_from([
            "x",
            "--plan",
            "dp=2,pp=3",
            "--global-batch",
            "128",
            "--predict",
        ])
        .unwrap()
        .planner;
        assert_eq!(
            parsed.plan,
            PlanRequest::Hybrid {
                data_parallel: 2,
                stages: 3
            }
        );
        assert_eq!(parsed.global_batch, Some(128));
        assert!(parsed.predict);
        assert_eq!(
            Command::try_parse_from(["x"]).unwrap().planner,
            PlanOptions::default()
        );
        assert!(Command::try_parse_from(["x", "--plan", "pp=0"]).is_err());
        let off = Command::try_parse_from(["x", "--profile-cache", "off"]).unwrap();
        assert_eq!(off.planner.profile_cache, ProfileCacheChoice::Off);
        assert!(Command::try_parse_from(["x", "--profile-cache", ""]).is_err());
    }
}
