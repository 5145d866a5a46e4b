//! The output rows of the direct convolution's pieces: which (image, output row) each tile row
//! is, and how a piece's rows are shared out among parallel parts, each holding the only
//! mutable view of the rows it writes.

use std::ops::Range;

/// The order of a piece's output rows: row `r` is (image within the piece, output row).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowOrder {
    /// Images in the piece.
    pub images: usize,
    /// Output height.
    pub height: usize,
    /// Output row by output row, the piece's images in turn (else image by image).
    pub across_images: bool,
}

impl RowOrder {
    /// Rows of the piece.
    pub fn rows(&self) -> usize {
        self.images * self.height
    }

    /// (image within the piece, output row) of row `r`.
    pub fn at(&self, r: usize) -> (usize, usize) {
        if self.across_images {
            (r % self.images, r / self.images)
        } else {
            (r / self.height, r % self.height)
        }
    }

    /// The output rows of image `slot` among the piece's rows `rows` (one range in either
    /// order).
    fn of_image(&self, slot: usize, rows: &Range<usize>) -> Range<usize> {
        // How many of the image's output rows come before piece row `r`.
        let before = |r: usize| {
            if self.across_images {
                r.saturating_sub(slot).div_ceil(self.images)
            } else {
                r.saturating_sub(slot * self.height)
            }
            .min(self.height)
        };
        before(rows.start)..before(rows.end)
    }
}

/// The rows one part of a piece writes: for each image it touches, output rows `first..` of
/// the block's planes (one slice per channel).
#[derive(Debug, Default)]
pub(crate) struct PartOutput<'a> {
    images: Vec<(usize, usize, Vec<&'a mut [f32]>)>,
}

impl<'a> PartOutput<'a> {
    /// The rows the part holds of image `slot`: the first output row, and from it one slice
    /// per channel.
    ///
    /// # Panics
    ///
    /// If the part holds no row of that image.
    pub fn image(&mut self, slot: usize) -> (usize, &mut [&'a mut [f32]]) {
        let (_, first, planes) = self
            .images
            .iter_mut()
            .find(|(s, _, _)| *s == slot)
            .expect("direct convolution: a row of another part");
        (*first, planes)
    }
}

/// Shares `block` (the block's output, one `[channels, Ho·Wo]` slice per image of the piece)
/// out among `parts` (consecutive ranges of rows in `order`, covering them all).
///
/// # Panics
///
/// If the parts do not cover the piece's rows in order.
pub(crate) fn share_rows<'a>(
    block: Vec<&'a mut [f32]>,
    order: RowOrder,
    parts: &[Range<usize>],
    width: usize,
) -> Vec<PartOutput<'a>> {
    assert_eq!(
        parts.first().map_or(0, |p| p.start),
        0,
        "direct convolution: parts from the first row"
    );
    assert_eq!(
        parts.last().map_or(0, |p| p.end),
        order.rows(),
        "direct convolution: parts to the last row"
    );
    let mut shared: Vec<PartOutput<'a>> = parts.iter().map(|_| PartOutput::default()).collect();
    let plane = order.height * width;
    for (slot, image) in block.into_iter().enumerate() {
        let mut rests: Vec<&'a mut [f32]> = image.chunks_exact_mut(plane).collect();
        let mut next = 0;
        for (part, rows) in shared.iter_mut().zip(parts) {
            let own = order.of_image(slot, rows);
            if own.is_empty() {
                continue;
            }
            assert_eq!(own.start, next, "direct convolution: parts out of order");
            next = own.end;
            let planes = rests
                .iter_mut()
                .map(|rest| {
                    let (mine, tail) = std::mem::take(rest).split_at_mut(own.len() * width);
                    *rest = tail;
                    mine
                })
                .collect();
            part.images.push((slot, own.start, planes));
        }
        assert_eq!(next, order.height, "direct convolution: rows left unshared");
    }
    shared
}

#[cfg(test)]
mod tests {
    use super::{RowOrder, share_rows};

    /// Every (image, row, channel) of a piece lands in exactly the part whose rows hold it,
    /// in both orders, with a partial last image group and parts cutting through images.
    #[test]
    fn every_row_is_held_by_the_part_of_its_row() {
        let (height, width, channels) = (5, 4, 3);
        for across_images in [false, true] {
            for images in [1, 2, 3] {
                let order = RowOrder {
                    images,
                    height,
                    across_images,
                };
                let rows = order.rows();
                for step in [3, 6, rows] {
                    let parts: Vec<_> = (0..rows)
                        .step_by(step)
                        .map(|s| s..rows.min(s + step))
                        .collect();
                    let mut values = vec![0.0f32; images * channels * height * width];
                    let block: Vec<&mut [f32]> =
                        values.chunks_mut(channels * height * width).collect();
                    let mut shared = share_rows(block, order, &parts, width);
                    for (index, rows) in parts.iter().enumerate() {
                        for r in rows.clone() {
                            let (slot, row) = order.at(r);
                            let (first, planes) = shared[index].image(slot);
                            for (channel, plane) in planes.iter_mut().enumerate() {
                                plane[(row - first) * width..][..width]
                                    .fill((r * 10 + channel) as f32 + 1.0);
                            }
                        }
                    }
                    drop(shared);
                    for (slot, image) in values.chunks(channels * height * width).enumerate() {
                        for (channel, plane) in image.chunks(height * width).enumerate() {
                            for (row, line) in plane.chunks(width).enumerate() {
                                let r = (0..rows).find(|&r| order.at(r) == (slot, row)).unwrap();
                                let expected = (r * 10 + channel) as f32 + 1.0;
                                assert!(
                                    line.iter().all(|&v| v == expected),
                                    "{across_images} {images} {step}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
