//! im2col for convolutions strided along the width (ResNet's stride-2 layers).
//!
//! Row by row, a strided column row reads every `s`-th element of an input row, one scalar
//! load at a time: for a 3×3 stride-2 convolution of 16 channels at 32×32 that gather was
//! more than half of the forward. Here each input plane is first split into its `s` column
//! phases (phase `p` holds columns `p, p + s, p + 2s, …`), once per plane instead of once
//! per tap, and every output line is then one contiguous copy out of a phase. Only data
//! moves: the columns are the same as [`crate::conv::im2col::columns::im2col`] writes.

use std::ops::Range;

use rayon::prelude::*;

use crate::conv::dims::ConvDims;

/// [`crate::conv::im2col::columns::im2col`] for `dims.geometry.stride[1] > 1`: the columns of `images` of
/// `x` into `columns` (`[K, images.len(), Ho, Wo]`), one input channel's `kh·kw` rows per
/// parallel piece.
pub(crate) fn im2col_strided(
    x: &[f32],
    dims: &ConvDims,
    images: Range<usize>,
    columns: &mut [f32],
) {
    let g = dims.geometry;
    let stride = g.stride[1];
    debug_assert!(stride > 1);
    let [height, width] = dims.input;
    let [kh, kw] = dims.kernel;
    let [out_h, out_w] = dims.output;
    let (count, positions) = (images.len(), dims.positions());
    let phase_width = width.div_ceil(stride);
    // (phase, base) of each tap column: output column wo reads input column
    // wo·s + t = (wo + base)·s + phase.
    let taps: Vec<(usize, isize)> = (0..kw)
        .map(|j| {
            let t = (j * g.dilation[1]) as isize - g.padding[1].0 as isize;
            let phase = t.rem_euclid(stride as isize);
            (phase as usize, (t - phase) / stride as isize)
        })
        .collect();
    let mut used = vec![false; stride];
    for &(phase, _) in &taps {
        used[phase] = true;
    }
    columns
        .par_chunks_mut(kh * kw * count * positions)
        .enumerate()
        .for_each_init(Vec::new, |phases: &mut Vec<f32>, (channel, dst)| {
            phases.resize(stride * height * phase_width, 0.0);
            for (slot, image) in images.clone().enumerate() {
                let plane =
                    &x[(image * dims.channels + channel) * height * width..][..height * width];
                split_phases(plane, width, stride, &used, phase_width, phases);
                for i in 0..kh {
                    for j in 0..kw {
                        let row =
                            &mut dst[((i * kw + j) * count + slot) * positions..][..positions];
                        let valid = dims.valid_columns(j);
                        let (phase, base) = taps[j];
                        for (out_row, line) in row.chunks_exact_mut(out_w).enumerate().take(out_h) {
                            let source = dims.source(0, out_row, i).filter(|_| !valid.is_empty());
                            let Some(src_row) = source else {
                                line.fill(0.0);
                                continue;
                            };
                            line[..valid.start].fill(0.0);
                            line[valid.end..].fill(0.0);
                            let first = (valid.start as isize + base) as usize;
                            let src =
                                &phases[(phase * height + src_row) * phase_width..][..phase_width];
                            line[valid.clone()].copy_from_slice(&src[first..][..valid.len()]);
                        }
                    }
                }
            }
        });
}

/// `phases[p][r][c] = plane[r][c·stride + p]` for every column of the `width`-wide plane and
/// each `used` phase `p` (a 1×1 kernel reads one); each phase row is `phase_width` long (its
/// tail past the plane's last column is left as it was and never read).
fn split_phases(
    plane: &[f32],
    width: usize,
    stride: usize,
    used: &[bool],
    phase_width: usize,
    phases: &mut [f32],
) {
    let height = plane.len() / width;
    for (r, src) in plane.chunks_exact(width).enumerate() {
        for p in (0..stride.min(width)).filter(|&p| used[p]) {
            let row = &mut phases[(p * height + r) * phase_width..][..phase_width];
            for (dst, value) in row.iter_mut().zip(src[p..].iter().step_by(stride)) {
                *dst = *value;
            }
        }
    }
}
