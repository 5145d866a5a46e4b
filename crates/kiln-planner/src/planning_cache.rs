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
            machine: machine(),
            precision: "f32".into(),
            optimizer: self.optimizer.clone(),
            threads: self.threads,
            batches: batches.to_vec(),
            kiln: env!("CARGO_PKG_VERSION").into(),
            gradient_checkpointing: false,
        }
    }
}

/// The host as a profile depends on it: the CPU's name, the widest vector instructions it
/// has (a name like `AMD EPYC` covers generations with and without AVX-512), a `KILN_MAX_ISA`
/// cap on kiln's kernels, and whether this is a debug build (kiln's own crates at a lower
/// optimisation level).
fn machine() -> String {
    let mut machine = kiln_core::cpu_name();
    #[cfg(target_arch = "x86_64")]
    {
        let vectors = if std::arch::is_x86_feature_detected!("avx512f") {
            "avx512f"
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            "avx2+fma"
        } else {
            "sse2"
        };
        machine = format!("{machine}, {vectors}");
    }
    if let Ok(cap) = std::env::var("KILN_MAX_ISA") {
        machine = format!("{machine}, KILN_MAX_ISA={cap}");
    }
    if cfg!(debug_assertions) {
        machine = format!("{machine}, debug build");
    }
    machine
}
