//! Which vector instructions kiln's hand-written kernels use: the CPU's best, capped by
//! [`MAX_ISA_VARIABLE`].

/// The instruction set a vector kernel runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// Plain Rust (the direct convolutions are then not dispatched to).
    Portable,
    /// AVX2 with FMA (the direct tile in register blocks, `direct/tile_avx2.rs`).
    Avx2,
    /// AVX-512F.
    Avx512,
}

/// The environment variable that caps the instruction set of kiln's vector kernels (the
/// direct tiles, batch norm's sums: `avx2` or `portable`), like oneDNN's `ONEDNN_MAX_CPU_ISA`: to compare paths on one machine, or to
/// reproduce what a CPU without AVX-512 computes.
pub const MAX_ISA_VARIABLE: &str = "KILN_MAX_ISA";

impl Isa {
    /// The best instruction set this CPU has, capped by [`MAX_ISA_VARIABLE`].
    pub(crate) fn current() -> Self {
        static CURRENT: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(|| {
            let cap = match std::env::var(MAX_ISA_VARIABLE) {
                Ok(value) => Self::parse(&value).unwrap_or_else(|| {
                    eprintln!(
                        "kiln: {MAX_ISA_VARIABLE}={value:?} is not one of avx512, avx2, \
                         portable; using the CPU's best"
                    );
                    Isa::Avx512
                }),
                Err(_) => Isa::Avx512,
            };
            Self::detected().min(cap)
        })
    }

    /// `avx512`, `avx2` or `portable` (any case).
    fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "avx512" => Some(Isa::Avx512),
            "avx2" => Some(Isa::Avx2),
            "portable" => Some(Isa::Portable),
            _ => None,
        }
    }

    /// The best instruction set this CPU has.
    pub(crate) fn detected() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}
