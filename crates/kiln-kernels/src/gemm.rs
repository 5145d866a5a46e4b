//! A safe front to the `gemm` crate's f32 matrix product over strided slices.

use gemm::Parallelism;

/// A `rows × cols` matrix inside a slice: element (i, j) at `i·row_stride + j·col_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Matrix {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Distance between consecutive rows, in elements.
    pub row_stride: usize,
    /// Distance between consecutive columns, in elements.
    pub col_stride: usize,
}

impl Matrix {
    /// A contiguous row-major `rows × cols` matrix.
    pub fn row_major(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The same elements read as the transposed matrix.
    pub fn transposed(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// One past the largest offset the matrix touches (0 when empty).
    fn span(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride + 1
        }
    }
}

/// `dst = lhs × rhs`, or `dst += lhs × rhs` when `accumulate`. `dst` is row-major and
/// contiguous. The product runs on gemm's kernels, threaded in the caller's rayon pool when
/// it is large enough; gemm splits rows and columns among threads, never the sum over the
/// inner dimension, so the result does not depend on the number of threads.
///
/// # Panics
///
/// If the shapes do not chain (`lhs.cols != rhs.rows`, or `dst` is not `lhs.rows ×
/// rhs.cols`), or a matrix reaches past the end of its slice.
pub(crate) fn matmul(
    dst: &mut [f32],
    accumulate: bool,
    lhs: (&[f32], Matrix),
    rhs: (&[f32], Matrix),
) {
    let out = Matrix::row_major(lhs.1.rows, rhs.1.cols);
    matmul_into((dst, out), accumulate, lhs, rhs, true);
}

/// [`matmul`] into a destination whose rows lie `out.row_stride` apart (a block of columns
/// of a wider row-major matrix: one attention head's columns, say); on the caller's thread
/// alone unless `threaded` (a caller already splitting its work over the pool says no).
///
/// # Panics
///
/// As [`matmul`]; also if `out` is not `lhs.rows × rhs.cols`, its columns are not adjacent
/// (`col_stride != 1`) or its rows overlap (`row_stride < cols`).
pub(crate) fn matmul_into(
    dst: (&mut [f32], Matrix),
    accumulate: bool,
    lhs: (&[f32], Matrix),
    rhs: (&[f32], Matrix),
    threaded: bool,
) {
    let ((dst, out), (lhs, a), (rhs, b)) = (dst, lhs, rhs);
    assert_eq!(a.cols, b.rows, "matmul: inner dimensions differ");
    assert_eq!(
        (out.rows, out.cols),
        (a.rows, b.cols),
        "matmul: destination shape"
    );
    assert!(
        out.col_stride == 1 && out.row_stride >= out.cols,
        "matmul: destination rows must not overlap"
    );
    assert!(out.span() <= dst.len(), "matmul: destination too short");
    assert!(a.span() <= lhs.len(), "matmul: left operand too short");
    assert!(b.span() <= rhs.len(), "matmul: right operand too short");
    if out.span() == 0 {
        return;
    }
    if a.cols == 0 {
        if !accumulate {
            for row in dst[..out.span()].chunks_mut(out.row_stride) {
                row[..out.cols].fill(0.0);
            }
        }
        return;
    }
    let as_isize = |v: usize| isize::try_from(v).expect("matmul: stride fits in isize");
    // SAFETY: every offset gemm reads or writes is `i·row_stride + j·col_stride` with `i` and
    // `j` below the matrix's rows and columns, hence below its `span()`, which the asserts
    // above bound by the slice's length; `dst` is borrowed mutably and so aliases neither
    // operand, and with unit column stride and rows no closer than its width it maps
    // distinct (i, j) to distinct elements, so gemm's threads never write the same element.
    unsafe {
        gemm::gemm(
            out.rows,
            out.cols,
            a.cols,
            dst.as_mut_ptr(),
            as_isize(out.col_stride),
            as_isize(out.row_stride),
            accumulate,
            lhs.as_ptr(),
            as_isize(a.col_stride),
            as_isize(a.row_stride),
            rhs.as_ptr(),
            as_isize(b.col_stride),
            as_isize(b.row_stride),
            1.0,
            1.0,
            false,
            false,
            false,
            if threaded {
                Parallelism::Rayon(0)
            } else {
                Parallelism::None
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{Matrix, matmul, matmul_into};

    fn naive(a: &[f32], am: Matrix, b: &[f32], bm: Matrix) -> Vec<f32> {
        let mut out = vec![0.0; am.rows * bm.cols];
        for i in 0..am.rows {
            for j in 0..bm.cols {
                out[i * bm.cols + j] = (0..am.cols)
                    .map(|k| {
                        a[i * am.row_stride + k * am.col_stride]
                            * b[k * bm.row_stride + j * bm.col_stride]
                    })
                    .sum();
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_for_strided_and_transposed_operands() {
        // Small whole numbers: every sum is exact in f32, whatever the order.
        let a: Vec<f32> = (0..7 * 5).map(|i| (i % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..5 * 9).map(|i| (i % 3) as f32 - 1.0).collect();
        let am = Matrix::row_major(7, 5);
        let bm = Matrix::row_major(5, 9);
        let mut out = vec![f32::NAN; 7 * 9];
        matmul(&mut out, false, (&a, am), (&b, bm));
        assert_eq!(out, naive(&a, am, &b, bm));
        // Accumulating adds the product again.
        matmul(&mut out, true, (&a, am), (&b, bm));
        let twice: Vec<f32> = naive(&a, am, &b, bm).iter().map(|v| 2.0 * v).collect();
        assert_eq!(out, twice);
        // bᵀ·aᵀ read through transposed views equals (a·b)ᵀ.
        let mut t = vec![0.0; 9 * 7];
        matmul(&mut t, false, (&b, bm.transposed()), (&a, am.transposed()));
        let ab = naive(&a, am, &b, bm);
        for i in 0..7 {
            for j in 0..9 {
                assert_eq!(t[j * 7 + i], ab[i * 9 + j]);
            }
        }
    }

    /// Into a block of columns of a wider matrix: the block gets the product, the columns
    /// beside it stay as they were.
    #[test]
    fn into_a_column_block_leaves_the_other_columns() {
        let a: Vec<f32> = (0..4 * 3).map(|i| (i % 4) as f32 - 1.0).collect();
        let b: Vec<f32> = (0..3 * 2).map(|i| (i % 3) as f32).collect();
        let (am, bm) = (Matrix::row_major(4, 3), Matrix::row_major(3, 2));
        let mut wide = [7.0; 4 * 5];
        let block = Matrix {
            rows: 4,
            cols: 2,
            row_stride: 5,
            col_stride: 1,
        };
        matmul_into((&mut wide[1..], block), false, (&a, am), (&b, bm), false);
        let expected = naive(&a, am, &b, bm);
        for i in 0..4 {
            assert_eq!(&wide[i * 5 + 1..i * 5 + 3], &expected[i * 2..i * 2 + 2]);
            assert_eq!(wide[i * 5], 7.0);
            assert_eq!(&wide[i * 5 + 3..i * 5 + 5], &[7.0, 7.0]);
        }
    }

    #[test]
    #[should_panic(expected = "right operand too short")]
    fn a_short_operand_is_refused() {
        let a = vec![1.0; 6];
        let b = vec![1.0; 5];
        let mut out = vec![0.0; 4];
        matmul(
            &mut out,
            false,
            (&a, Matrix::row_major(2, 3)),
            (&b, Matrix::row_major(3, 2)),
        );
    }
}
