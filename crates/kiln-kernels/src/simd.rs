//! Loops compiled for the CPU's widest vectors, chosen at run time.
//!
//! The crate builds for baseline x86-64 (SSE2); `pulp::Arch::dispatch` (gemm's own
//! dispatch) runs a closure compiled for AVX-512 or AVX2 where the CPU has them. Only
//! additions, subtractions and multiplications run there, never fused (Rust does not
//! contract `a * b + c`), so any vector width gives the same bits.

/// Runs `body` compiled for the widest instruction set this CPU offers (AVX-512 where
/// present), so that its element-wise loops vectorize to that width. `body` must be an
/// `#[inline(always)]` closure, and what it calls `#[inline(always)]` too: otherwise it stays
/// a function of its own, compiled for the crate's baseline (SSE2), and only the call sits
/// in the dispatched code.
#[inline(always)]
pub(crate) fn simd<R>(body: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(body)
}
