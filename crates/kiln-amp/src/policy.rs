//! Which parameters stay f32.

/// The mixed-precision policy: parameters whose dotted path has a segment matching one of
/// the kept patterns stay f32 in the working copy; all other trainable parameters are cast.
///
/// A pattern is a path segment, optionally with a leading or trailing `*`:
/// `bn*` matches `bn1`, `*norm*` matches `layer_norm`, `fc` matches only `fc`.
///
/// ```
/// use kiln_amp::AmpPolicy;
/// let policy = AmpPolicy::default();
/// assert!(policy.keeps_f32("blocks.3.bn2.gamma"));
/// assert!(!policy.keeps_f32("blocks.3.conv2.weight"));
/// assert!(AmpPolicy::default().keep("fc").keeps_f32("fc.weight"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmpPolicy {
    keep: Vec<String>,
}

impl Default for AmpPolicy {
    /// Batch-norm layers (`bn*`, `*norm*`) stay f32.
    fn default() -> Self {
        Self {
            keep: vec!["bn*".into(), "*norm*".into()],
        }
    }
}

impl AmpPolicy {
    /// A policy that casts every trainable parameter: the most memory saved. Buffers (such
    /// as batch-norm running statistics) are never cast, so a model's batch-norm layers must
    /// accept half-precision weights with f32 statistics, as kiln's ResNet does (normalising
    /// in half precision, accumulating running statistics in f32).
    pub fn cast_everything() -> Self {
        Self { keep: Vec::new() }
    }

    /// Also keeps parameters under path segments matching `pattern` in f32.
    pub fn keep(mut self, pattern: impl Into<String>) -> Self {
        self.keep.push(pattern.into());
        self
    }

    /// Whether the parameter at `path` stays f32.
    pub fn keeps_f32(&self, path: &str) -> bool {
        path.split('.')
            .any(|segment| self.keep.iter().any(|pattern| matches(pattern, segment)))
    }
}

fn matches(pattern: &str, segment: &str) -> bool {
    match (pattern.strip_prefix('*'), pattern.strip_suffix('*')) {
        (Some(rest), _) if rest.ends_with('*') => segment.contains(&rest[..rest.len() - 1]),
        (Some(suffix), _) => segment.ends_with(suffix),
        (None, Some(prefix)) => segment.starts_with(prefix),
        (None, None) => segment == pattern,
    }
}
