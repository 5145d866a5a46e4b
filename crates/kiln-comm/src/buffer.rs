//! A buffer laid out for zero-copy in-process reduction.

use std::ops::Range;

/// The element range of chunk `chunk` when `len` elements are split over `parts` ranks.
pub(crate) fn chunk_range(len: usize, parts: usize, chunk: usize) -> Range<usize> {
    (chunk * len / parts)..((chunk + 1) * len / parts)
}

/// An `f32` buffer stored as one chunk per rank, for [`Communicator::all_reduce_buffer`].
///
/// The in-process backend moves the chunks into the group's shared slots without copying;
/// rank `c` reduces chunk `c` of every slot into every rank's output chunk `c`, and each rank
/// then takes its output chunks as its buffer's chunks, again without copying. Per rank that
/// is one read and one write of the buffer: about a memcpy's worth of memory traffic, against
/// roughly three for [`Communicator::all_reduce`] on a slice, which must stage its input and
/// copy the result back. The price is one spare allocation of the buffer's size per rank,
/// kept by the group for the outputs. Inputs are never overwritten, so a failed reduction
/// hands the buffer back with its original values. Fill it with [`copy_from`](Self::copy_from) or
/// [`chunks_mut`](Self::chunks_mut) (e.g. straight from gradient tensors).
///
/// [`Communicator::all_reduce_buffer`]: crate::Communicator::all_reduce_buffer
/// [`Communicator::all_reduce`]: crate::Communicator::all_reduce
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceBuffer {
    len: usize,
    pub(crate) chunks: Vec<Vec<f32>>,
}

impl ReduceBuffer {
    /// A zeroed buffer of `len` elements for a group of `world_size` ranks.
    ///
    /// # Panics
    /// If `world_size` is zero.
    pub fn new(len: usize, world_size: usize) -> Self {
        assert!(world_size > 0, "a group needs at least one rank");
        let chunks = (0..world_size)
            .map(|c| vec![0.0; chunk_range(len, world_size, c).len()])
            .collect();
        Self { len, chunks }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of ranks it is laid out for.
    pub fn world_size(&self) -> usize {
        self.chunks.len()
    }

    /// Copies `src` in.
    ///
    /// # Panics
    /// If `src.len() != self.len()`.
    pub fn copy_from(&mut self, src: &[f32]) {
        assert_eq!(src.len(), self.len, "length mismatch");
        for (range, chunk) in self.chunks_mut() {
            chunk.copy_from_slice(&src[range]);
        }
    }

    /// Fills the buffer from `values`, in order (e.g. a slice followed by extra elements).
    ///
    /// # Panics
    /// If `values` yields fewer than `self.len()` elements.
    pub fn fill_from(&mut self, values: impl IntoIterator<Item = f32>) {
        let mut values = values.into_iter();
        for (_, chunk) in self.chunks_mut() {
            for slot in chunk {
                *slot = values.next().expect("fewer values than the buffer holds");
            }
        }
    }

    /// The contents as one vector.
    pub fn to_vec(&self) -> Vec<f32> {
        self.chunks.concat()
    }

    /// Copies the contents to `dst`.
    ///
    /// # Panics
    /// If `dst.len() != self.len()`.
    pub fn copy_to(&self, dst: &mut [f32]) {
        assert_eq!(dst.len(), self.len, "length mismatch");
        for (range, chunk) in self.chunks() {
            dst[range].copy_from_slice(chunk);
        }
    }

    /// The chunks with their element ranges.
    pub fn chunks(&self) -> impl Iterator<Item = (Range<usize>, &[f32])> {
        let (len, parts) = (self.len, self.chunks.len());
        self.chunks
            .iter()
            .enumerate()
            .map(move |(c, chunk)| (chunk_range(len, parts, c), chunk.as_slice()))
    }

    /// The chunks with their element ranges, writable.
    pub fn chunks_mut(&mut self) -> impl Iterator<Item = (Range<usize>, &mut [f32])> {
        let (len, parts) = (self.len, self.chunks.len());
        self.chunks
            .iter_mut()
            .enumerate()
            .map(move |(c, chunk)| (chunk_range(len, parts, c), chunk.as_mut_slice()))
    }

    /// The element at `index`.
    ///
    /// # Panics
    /// If `index >= self.len()`.
    pub fn get(&self, index: usize) -> f32 {
        let parts = self.chunks.len();
        let chunk = (0..parts)
            .find(|&c| chunk_range(self.len, parts, c).contains(&index))
            .expect("index out of range");
        self.chunks[chunk][index - chunk_range(self.len, parts, chunk).start]
    }
}
