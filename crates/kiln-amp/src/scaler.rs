//! Dynamic loss scaling.

use serde::{Deserialize, Serialize};

/// How the loss scale evolves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GradScalerConfig {
    /// The first scale (default 2^16).
    pub init_scale: f32,
    /// Factor after `growth_interval` consecutive finite steps (default 2).
    pub growth_factor: f32,
    /// Factor after a step with an inf/NaN gradient (default 0.5).
    pub backoff_factor: f32,
    /// Consecutive finite steps before growing (default 2000).
    pub growth_interval: usize,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        Self {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// PyTorch's `GradScaler` semantics: multiply the loss by [`scale`](Self::scale) before
/// backward, divide gradients by it, and [`update`](Self::update) with whether any gradient
/// was not finite. Serialise it with the checkpoint to resume with the same scale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradScaler {
    config: GradScalerConfig,
    scale: f32,
    growth_tracker: usize,
    skipped_steps: usize,
}

impl Default for GradScaler {
    fn default() -> Self {
        Self::new(GradScalerConfig::default())
    }
}

impl GradScaler {
    /// A scaler at `config.init_scale`.
    pub fn new(config: GradScalerConfig) -> Self {
        Self {
            scale: config.init_scale,
            config,
            growth_tracker: 0,
            skipped_steps: 0,
        }
    }

    /// The current loss scale.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Finite steps since the last growth or backoff.
    pub fn growth_tracker(&self) -> usize {
        self.growth_tracker
    }

    /// Steps skipped because of non-finite gradients.
    pub fn skipped_steps(&self) -> usize {
        self.skipped_steps
    }

    /// Records a step's outcome; returns whether the optimizer should apply it.
    pub fn update(&mut self, found_non_finite: bool) -> bool {
        if found_non_finite {
            self.scale *= self.config.backoff_factor;
            self.growth_tracker = 0;
            self.skipped_steps += 1;
            return false;
        }
        self.growth_tracker += 1;
        if self.growth_tracker >= self.config.growth_interval {
            self.scale *= self.config.growth_factor;
            self.growth_tracker = 0;
        }
        true
    }
}
