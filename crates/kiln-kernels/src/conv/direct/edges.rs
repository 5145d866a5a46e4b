//! Where a direct-convolution tile reads only padding: the kernel rows at the output's top
//! and bottom edges and the kernel columns at its left and right edges, whose taps the tiles
//! leave out (zeros add nothing).

use std::ops::Range;

use crate::conv::dims::ConvDims;
use crate::conv::direct::tile::{ColumnSkip, TILE_COLUMNS};

/// For each output row, the kernel rows that read one of the input's rows rather than its
/// padding: all of them but at the top and bottom edges (a third fewer multiply-adds there
/// with a 3×3 kernel, a sixth of all of a 4×4 output's).
pub(crate) fn kernel_rows_reading_input(dims: &ConvDims) -> Vec<Range<usize>> {
    let (top, height) = (dims.geometry.padding[0].0, dims.input[0]);
    let (stride, dilation) = (dims.geometry.stride[0], dims.geometry.dilation[0]);
    (0..dims.output[0])
        .map(|oh| {
            let reads_input = |i: usize| {
                let row = oh * stride + i * dilation;
                row >= top && row - top < height
            };
            let mut rows = (0..dims.kernel[0]).filter(|&i| reads_input(i));
            match (rows.next(), rows.next_back()) {
                (Some(first), last) => first..last.unwrap_or(first) + 1,
                (None, _) => 0..0,
            }
        })
        .collect()
}

/// For each tile column (output columns `4·i..4·i + 4`), the taps of a 3-wide kernel that
/// read the input's left or right padding from the tile's first or last column: kernel
/// column 0 at the left edge, 2 at the right (with padding 1; a twelfth of a tile's
/// multiply-adds each, a sixth of a 4-wide output's). The steps run kernel column innermost
/// (`direct::forward::StepOrder`), in threes. Other kernel widths compute every tap.
pub(crate) fn padding_columns(dims: &ConvDims) -> Vec<ColumnSkip> {
    let (left, width) = (dims.geometry.padding[1].0, dims.input[1]);
    let (stride, dilation) = (dims.geometry.stride[1], dims.geometry.dilation[1]);
    let reads_padding = |column: usize, j: usize| {
        let at = column * stride + j * dilation;
        at < left || at - left >= width
    };
    (0..dims.output[1])
        .step_by(TILE_COLUMNS)
        .map(|first| match dims.kernel[1] {
            3 => ColumnSkip {
                first: reads_padding(first, 0),
                last: reads_padding(first + TILE_COLUMNS - 1, 2),
            },
            _ => ColumnSkip::NONE,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{kernel_rows_reading_input, padding_columns};
    use crate::conv::direct::tile::ColumnSkip;
    use crate::conv::geometry::ConvGeometry;
    use crate::test_support::conv_dims as dims;

    #[test]
    fn edge_rows_leave_out_the_kernel_rows_over_padding() {
        let same = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
        let d = dims(8, [4, 4], [3, 3], same);
        assert_eq!(kernel_rows_reading_input(&d), [1..3, 0..3, 0..3, 0..2]);
        // Stride 2: only the top row reaches into the padding.
        let d = dims(8, [8, 8], [3, 3], same.with_stride([2, 2]));
        assert_eq!(kernel_rows_reading_input(&d), [1..3, 0..3, 0..3, 0..3]);
        // Padding wider than the kernel's reach: a row reading nothing but padding.
        let wide = ConvGeometry::new().with_padding([(3, 0), (0, 0)]);
        let d = dims(8, [4, 4], [3, 3], wide);
        assert_eq!(kernel_rows_reading_input(&d)[..2], [0..0, 2..3]);
    }

    #[test]
    fn edge_tiles_leave_out_the_kernel_columns_over_padding() {
        let skip = |first, last| ColumnSkip { first, last };
        let same = ConvGeometry::new().with_padding([(1, 1), (1, 1)]);
        // One tile spans a 4-wide output: both edges.
        assert_eq!(
            padding_columns(&dims(8, [4, 4], [3, 3], same)),
            [skip(true, true)]
        );
        assert_eq!(
            padding_columns(&dims(8, [12, 12], [3, 3], same)),
            [skip(true, false), ColumnSkip::NONE, skip(false, true)]
        );
        // Stride 2 reads no padding on the right; no padding, none at all.
        let strided = same.with_stride([2, 2]);
        assert_eq!(
            padding_columns(&dims(8, [16, 16], [3, 3], strided)),
            [skip(true, false), ColumnSkip::NONE]
        );
        let valid = dims(8, [10, 10], [3, 3], ConvGeometry::new());
        assert_eq!(
            padding_columns(&valid),
            [ColumnSkip::NONE, ColumnSkip::NONE]
        );
        // Dilation 2 with padding 2: kernel columns 0 and 2 reach the padding.
        let dilated = ConvGeometry::new()
            .with_padding([(2, 2), (2, 2)])
            .with_dilation([2, 2]);
        assert_eq!(
            padding_columns(&dims(8, [8, 8], [3, 3], dilated)),
            [skip(true, false), skip(false, true)]
        );
        // Other kernel widths compute every tap.
        let wide = ConvGeometry::new().with_padding([(2, 2), (2, 2)]);
        assert_eq!(
            padding_columns(&dims(8, [4, 4], [5, 5], wide)),
            [ColumnSkip::NONE]
        );
    }
}
