//! Per-sample transforms, run in the loader's workers.

use rand::RngExt;
use rand::rngs::StdRng;

use crate::ImageItem;

/// One step of the per-sample pipeline.
///
/// Random steps draw from the generator the loader derives from (seed, epoch, sample index),
/// so the same sample gets the same augmentation whatever worker produces it.
#[derive(Debug, Clone, PartialEq)]
pub enum Transform {
    /// Pads by `padding` zeros on each side, then crops a random `height × width` window.
    RandomCrop {
        /// Zeros added on every side.
        padding: usize,
    },
    /// Mirrors left-right with probability `probability`.
    HorizontalFlip {
        /// Chance of flipping.
        probability: f64,
    },
    /// `(x - mean[c]) / std[c]` per channel.
    Normalize {
        /// Per-channel means.
        mean: Vec<f32>,
        /// Per-channel standard deviations.
        std: Vec<f32>,
    },
}

impl Transform {
    /// The usual CIFAR-10 training augmentation: 4-pixel padded crop and horizontal flip.
    pub fn cifar_augmentation() -> Vec<Transform> {
        vec![
            Transform::RandomCrop { padding: 4 },
            Transform::HorizontalFlip { probability: 0.5 },
        ]
    }

    /// CIFAR-10's per-channel normalisation.
    pub fn cifar_normalize() -> Transform {
        Transform::Normalize {
            mean: vec![0.4914, 0.4822, 0.4465],
            std: vec![0.2470, 0.2435, 0.2616],
        }
    }

    /// Applies the transform to `item`.
    ///
    /// # Panics
    /// If a `Normalize` has fewer entries than the image has channels.
    pub fn apply(&self, item: &mut ImageItem, rng: &mut StdRng) {
        let [channels, height, width] = item.shape;
        match self {
            Transform::RandomCrop { padding } => {
                let p = *padding as i64;
                let dy = rng.random_range(-p..=p) as isize;
                let dx = rng.random_range(-p..=p) as isize;
                let mut out = vec![0.0; item.pixels.len()];
                for c in 0..channels {
                    for y in 0..height {
                        let sy = y as isize + dy;
                        if sy < 0 || sy >= height as isize {
                            continue;
                        }
                        for x in 0..width {
                            let sx = x as isize + dx;
                            if sx >= 0 && sx < width as isize {
                                out[(c * height + y) * width + x] =
                                    item.pixels[(c * height + sy as usize) * width + sx as usize];
                            }
                        }
                    }
                }
                item.pixels = out;
            }
            Transform::HorizontalFlip { probability } => {
                if rng.random_bool(*probability) {
                    item.pixels.chunks_mut(width).for_each(<[f32]>::reverse);
                }
            }
            Transform::Normalize { mean, std } => {
                assert!(
                    mean.len() >= channels && std.len() >= channels,
                    "Normalize needs one mean and std per channel"
                );
                for (c, plane) in item.pixels.chunks_mut(height * width).enumerate() {
                    plane.iter_mut().for_each(|v| *v = (*v - mean[c]) / std[c]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::derived_rng;

    fn ramp() -> ImageItem {
        ImageItem {
            pixels: (0..2 * 3 * 4).map(|v| v as f32).collect(),
            shape: [2, 3, 4],
            label: 0,
        }
    }

    #[test]
    fn flip_mirrors_every_row_and_crop_without_padding_is_identity() {
        let mut item = ramp();
        Transform::HorizontalFlip { probability: 1.0 }.apply(&mut item, &mut derived_rng(0, 0, 0));
        assert_eq!(&item.pixels[..4], &[3.0, 2.0, 1.0, 0.0]);
        let mut item = ramp();
        Transform::RandomCrop { padding: 0 }.apply(&mut item, &mut derived_rng(0, 0, 0));
        assert_eq!(item, ramp());
    }

    #[test]
    fn crop_shifts_content_and_fills_with_zeros() {
        let mut seen_shift = false;
        for index in 0..20 {
            let mut item = ramp();
            Transform::RandomCrop { padding: 1 }.apply(&mut item, &mut derived_rng(1, 2, index));
            let kept = item.pixels.iter().filter(|&&v| v != 0.0).count();
            seen_shift |= item != ramp();
            assert!(
                kept >= 2 * 2 * 3 - 1,
                "a shift by at most one pixel keeps most values"
            );
        }
        assert!(seen_shift);
    }

    #[test]
    fn normalize_uses_per_channel_statistics() {
        let mut item = ramp();
        Transform::Normalize {
            mean: vec![0.0, 12.0],
            std: vec![1.0, 2.0],
        }
        .apply(&mut item, &mut derived_rng(0, 0, 0));
        assert_eq!(item.pixels[0], 0.0);
        assert_eq!(item.pixels[12], 0.0);
        assert_eq!(item.pixels[13], 0.5);
    }
}
