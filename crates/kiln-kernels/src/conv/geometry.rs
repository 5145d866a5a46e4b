//! The shape arithmetic of a 2-D convolution: stride, padding, dilation and the output size.

/// Stride, padding and dilation of a 2-D convolution without groups.
///
/// `padding` is `(before, after)` per spatial dimension (height, width), so asymmetric
/// padding is expressed directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Step between windows, per spatial dimension.
    pub stride: [usize; 2],
    /// Zeros added `(before, after)` per spatial dimension.
    pub padding: [(usize, usize); 2],
    /// Spacing between kernel taps, per spatial dimension.
    pub dilation: [usize; 2],
}

impl ConvGeometry {
    /// Unit stride, no padding, no dilation.
    pub fn new() -> Self {
        Self {
            stride: [1, 1],
            padding: [(0, 0), (0, 0)],
            dilation: [1, 1],
        }
    }

    /// With this stride.
    pub fn with_stride(mut self, stride: [usize; 2]) -> Self {
        self.stride = stride;
        self
    }

    /// With this `(before, after)` padding per spatial dimension.
    pub fn with_padding(mut self, padding: [(usize, usize); 2]) -> Self {
        self.padding = padding;
        self
    }

    /// With this dilation.
    pub fn with_dilation(mut self, dilation: [usize; 2]) -> Self {
        self.dilation = dilation;
        self
    }

    /// Output height and width for an input of `input` `[h, w]` and a kernel of `kernel`
    /// `[kh, kw]`, or `None` when the padded input is smaller than the dilated kernel or a
    /// stride or dilation is zero.
    pub fn output_size(&self, input: [usize; 2], kernel: [usize; 2]) -> Option<[usize; 2]> {
        let dim = |d: usize| {
            if self.stride[d] == 0 || self.dilation[d] == 0 || kernel[d] == 0 {
                return None;
            }
            let padded = input[d] + self.padding[d].0 + self.padding[d].1;
            let span = self.dilation[d] * (kernel[d] - 1) + 1;
            (padded >= span).then(|| (padded - span) / self.stride[d] + 1)
        };
        Some([dim(0)?, dim(1)?])
    }
}

impl Default for ConvGeometry {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::ConvGeometry;

    #[test]
    fn output_size_follows_the_convolution_formula() {
        let g = ConvGeometry::new()
            .with_stride([2, 1])
            .with_padding([(1, 1), (0, 2)]);
        // (7 + 2 - 3) / 2 + 1 = 4; (5 + 2 - 3) / 1 + 1 = 5
        assert_eq!(g.output_size([7, 5], [3, 3]), Some([4, 5]));
        let dilated = ConvGeometry::new().with_dilation([2, 2]);
        // span 5: (9 - 5) + 1 = 5
        assert_eq!(dilated.output_size([9, 9], [3, 3]), Some([5, 5]));
        assert_eq!(ConvGeometry::new().output_size([2, 2], [3, 3]), None);
        assert_eq!(
            ConvGeometry::new()
                .with_stride([0, 1])
                .output_size([4, 4], [1, 1]),
            None
        );
    }
}
