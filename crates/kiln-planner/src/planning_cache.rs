//! A planning's profiles through its cache: each device kind's profile read from the cache
//! when its exact key is there, else measured and stored. The cache is on by default in
//! commands (`--profile-cache default`), so it must never stop a run: a file that cannot be
//! read or written is a note, and the model is profiled.

use std::collections::BTreeMap;

use burn::tensor::Device;

use crate::{ModelProfile, PlanError, ProfileCache, ProfileKey, RunPlanning};

impl RunPlanning {
    /// One profile per device kind of `kinds` at `batches`, and whether every one came from
    /// the cache; what the cache did is written to `notes`.
    pub(crate) fn profiles(
        &self,
        kinds: &[(String, Device)],
        batches: &[usize],
        profile: &mut impl FnMut(&Device, ProfileKey) -> Result<ModelProfile, PlanError>,
        notes: &mut Vec<String>,
    ) -> Result<(BTreeMap<String, ModelProfile>, bool), PlanError> {
        let cache = self.profile_cache.as_ref().map(ProfileCache::new);
        let mut profiles = BTreeMap::new();
        let mut from_cache = Vec::new();
        for (kind, device) in kinds {
            let key = self.profile_key(kind, batches);
            let cached = cache.as_ref().and_then(|cache| {
                cache.load(&key).unwrap_or_else(|err| {
                    notes.push(format!("planner: profile cache: {err}; profiling again"));
                    None
                })
            });
            let measured = match cached {
                Some(measured) => {
                    from_cache.push(kind.as_str());
                    measured
                }
                None => {
                    let measured = profile(device, key)?;
                    if let Some(Err(err)) = cache.as_ref().map(|cache| cache.store(&measured)) {
                        notes.push(format!(
                            "planner: profile cache: {err}; the profile is not kept"
                        ));
                    }
                    measured
                }
            };
            profiles.insert(kind.clone(), measured);
        }
        if let (false, Some(dir)) = (from_cache.is_empty(), &self.profile_cache) {
            notes.push(format!(
                "planner: profile of {} from the cache in {} (--profile-cache off measures again)",
                from_cache.join(", "),
                dir.display()
            ));
        }
        Ok((profiles, from_cache.len() == kinds.len()))
    }

    /// What a profile of device kind `kind` at `batches` is measured under in this run.
    pub(crate) fn profile_key(&self, kind: &str, batches: &[usize]) -> ProfileKey {
        ProfileKey {
            model: self.model.clone(),
            device: kind.to_string(),
            machine: kiln_core::cpu_name(),
            precision: "f32".into(),
            optimizer: self.optimizer.clone(),
            threads: self.threads,
            batches: batches.to_vec(),
            kiln: env!("CARGO_PKG_VERSION").into(),
            gradient_checkpointing: false,
        }
    }
}
