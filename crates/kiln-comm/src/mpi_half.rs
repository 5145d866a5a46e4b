//! Half-precision values on the MPI wire: MPI has no half type, so halves travel as their
//! 16-bit patterns.

/// Up to this many ranks, half-precision all-reduce gathers halves instead of reducing f32.
pub(crate) const HALF_GATHER_MAX_RANKS: usize = 3;

/// How a half type is encoded in 16 bits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HalfEncoding {
    F16,
    Bf16,
}

impl HalfEncoding {
    pub(crate) fn of<T: 'static>() -> Option<Self> {
        use std::any::TypeId;
        if TypeId::of::<T>() == TypeId::of::<half::f16>() {
            Some(Self::F16)
        } else if TypeId::of::<T>() == TypeId::of::<half::bf16>() {
            Some(Self::Bf16)
        } else {
            None
        }
    }

    pub(crate) fn encode(self, value: f32) -> u16 {
        match self {
            Self::F16 => half::f16::from_f32(value).to_bits(),
            Self::Bf16 => half::bf16::from_f32(value).to_bits(),
        }
    }

    pub(crate) fn decode(self, bits: u16) -> f32 {
        match self {
            Self::F16 => half::f16::from_bits(bits).to_f32(),
            Self::Bf16 => half::bf16::from_bits(bits).to_f32(),
        }
    }
}
