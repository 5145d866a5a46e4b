//! The sizes of one convolution, and the index arithmetic every algorithm shares.

use std::ops::Range;

use crate::conv::geometry::ConvGeometry;

/// The sizes of one convolution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvDims {
    /// Input channels.
    pub channels: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Output height and width.
    pub output: [usize; 2],
    /// Stride, padding, dilation.
    pub geometry: ConvGeometry,
}

impl ConvDims {
    /// Rows of the column matrix: `Cin·kh·kw`.
    pub fn rows(&self) -> usize {
        self.channels * self.kernel[0] * self.kernel[1]
    }

    /// Output positions per image: `Ho·Wo`.
    pub fn positions(&self) -> usize {
        self.output[0] * self.output[1]
    }

    /// Elements of one input image: `Cin·H·W`.
    pub fn image_len(&self) -> usize {
        self.channels * self.input[0] * self.input[1]
    }

    /// The input coordinate along `dim` that output index `out` reads through kernel tap
    /// `tap`, if it falls inside the (unpadded) input.
    pub(crate) fn source(&self, dim: usize, out: usize, tap: usize) -> Option<usize> {
        let g = &self.geometry;
        (out * g.stride[dim] + tap * g.dilation[dim])
            .checked_sub(g.padding[dim].0)
            .filter(|&i| i < self.input[dim])
    }

    /// The output columns `wo` whose source column for tap `j` lies inside the input: a
    /// contiguous range, so the inner loops run without bounds tests.
    pub(crate) fn valid_columns(&self, j: usize) -> Range<usize> {
        let g = &self.geometry;
        let offset = j * g.dilation[1];
        let before = g.padding[1].0;
        let start = before.saturating_sub(offset).div_ceil(g.stride[1]);
        // Largest wo with wo·s + offset − before ≤ W − 1.
        let end = if self.input[1] + before > offset {
            ((self.input[1] + before - offset - 1) / g.stride[1] + 1).min(self.output[1])
        } else {
            0
        };
        start.min(end)..end
    }

    /// Splits `kernel_row` (an index below `rows()`) into (channel, tap row, tap column).
    pub(crate) fn tap(&self, kernel_row: usize) -> (usize, usize, usize) {
        let [kh, kw] = self.kernel;
        (
            kernel_row / (kh * kw),
            kernel_row / kw % kh,
            kernel_row % kw,
        )
    }
}
