//! Scratch vectors kept by each thread between calls, for buffers a kernel writes in full
//! before it reads them.
//!
//! The Winograd paths' per-split buffers started as empty vectors at every call, so each call
//! zero-filled them again (`resize`): about 1.4 % of a width-64 step on one thread. Kept on
//! the thread between calls, a buffer already large enough is handed out as it is.

use std::cell::Cell;

/// Most spare vectors a thread keeps.
const SPARES: usize = 4;

thread_local! {
    static SPARE: Cell<Vec<Vec<f32>>> = const { Cell::new(Vec::new()) };
}

/// Two vectors taken from the current thread's spares (or new ones), handed back when
/// dropped. Their contents are whatever their last user left: only for buffers written in
/// full before they are read. In tests every element handed out is NaN, so that a read of
/// an unwritten one shows in the results.
#[derive(Debug)]
pub(crate) struct ScratchPair {
    first: Vec<f32>,
    second: Vec<f32>,
}

impl ScratchPair {
    /// Takes two of the current thread's spare vectors (empty ones where it has too few). A
    /// use nested inside another on the same thread (a task stolen while waiting) finds those
    /// taken and gets new ones.
    pub fn take() -> Self {
        SPARE.with(|cell| {
            let mut spare = cell.take();
            let first = spare.pop().unwrap_or_default();
            let second = spare.pop().unwrap_or_default();
            cell.set(spare);
            Self { first, second }
        })
    }

    /// The first `first_len` elements of the first vector and `second_len` of the second,
    /// each grown (never shrunk) to hold them.
    pub fn get(&mut self, first_len: usize, second_len: usize) -> (&mut [f32], &mut [f32]) {
        (
            prefix(&mut self.first, first_len),
            prefix(&mut self.second, second_len),
        )
    }
}

fn prefix(vector: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if vector.len() < len {
        vector.resize(len, 0.0);
    }
    let values = &mut vector[..len];
    if cfg!(test) {
        values.fill(f32::NAN);
    }
    values
}

impl Drop for ScratchPair {
    fn drop(&mut self) {
        SPARE.with(|cell| {
            let mut spare = cell.take();
            // In reverse, so that the next `take` pops each back into its own place.
            for vector in [&mut self.second, &mut self.first] {
                if spare.len() < SPARES {
                    spare.push(std::mem::take(vector));
                }
            }
            cell.set(spare);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::ScratchPair;

    #[test]
    fn vectors_come_back_to_their_thread_and_a_nested_take_gets_its_own() {
        let pointers = {
            let mut scratch = ScratchPair::take();
            let (a, b) = scratch.get(1000, 10);
            assert!(
                a.iter().chain(b.iter()).all(|v| v.is_nan()),
                "poisoned in tests"
            );
            [a.as_ptr(), b.as_ptr()]
        };
        let mut outer = ScratchPair::take();
        let (a, b) = outer.get(500, 5);
        assert_eq!((a.len(), b.len()), (500, 5));
        let mut again = [a.as_ptr(), b.as_ptr()];
        again.sort();
        let mut kept = pointers;
        kept.sort();
        assert_eq!(again, kept, "kept by the thread");
        let mut inner = ScratchPair::take();
        let (c, _) = inner.get(500, 5);
        assert!(!pointers.contains(&c.as_ptr()), "taken by the outer use");
    }
}
