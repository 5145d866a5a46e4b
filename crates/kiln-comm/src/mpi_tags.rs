//! The message tags kiln sends under, and the check at start that this MPI allows them.
//!
//! The MPI standard promises tags up to 32767 only (`MPI_TAG_UB`); Open MPI and MPICH allow
//! up to 2^31 - 1, but an implementation may stop anywhere above 32767. kiln's tags go up to
//! [`HIGHEST_TAG`] ([`MpiMessages`](crate::MpiMessages): a split's context and a message kind
//! above 2^20), so an MPI with a smaller bound is refused when the world starts, naming the
//! library, instead of failing with MPI's own error in the middle of a run.

use crate::CommError;

/// Sub-communicators a process may make: their contexts keep message tags apart
/// ([`MpiMessages`](crate::MpiMessages)) and must stay within MPI's tag range.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) const MAX_CONTEXTS: u32 = 512;

/// The largest tag kiln sends under: a message kind of the last split's context.
pub(crate) const HIGHEST_TAG: i64 = (1 << 20) + (((MAX_CONTEXTS - 1) as i64) << 16) + 0xffff;

/// `MPI_TAG_UB` of `world`: the largest tag this MPI allows (`None` if it does not say).
#[cfg(feature = "mpi")]
pub(crate) fn tag_upper_bound(world: &mpi::topology::SimpleCommunicator) -> Option<i64> {
    use mpi::raw::AsRaw;
    use std::ffi::{c_int, c_void};

    let mut value: *mut c_int = std::ptr::null_mut();
    let mut found: c_int = 0;
    // SAFETY: `world` is a live communicator of an initialised MPI. For a predefined
    // attribute such as MPI_TAG_UB, MPI_Comm_get_attr stores into its third argument a
    // pointer to an int that MPI owns and keeps until MPI_Finalize, and sets `found` when the
    // attribute exists; both out-pointers point at locals of the right types. The int is read
    // only when MPI reported it found and the pointer is not null.
    unsafe {
        mpi::ffi::MPI_Comm_get_attr(
            world.as_raw(),
            mpi::ffi::MPI_TAG_UB as c_int,
            (&mut value as *mut *mut c_int).cast::<c_void>(),
            &mut found,
        );
        (found != 0 && !value.is_null()).then(|| i64::from(*value))
    }
}

/// Refuses an MPI whose largest tag (`upper`, `MPI_TAG_UB`) is below kiln's highest, naming
/// it (`library`: `MPI_Get_library_version`'s text).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn check_tag_range(upper: Option<i64>, library: &str) -> Result<(), CommError> {
    match upper {
        Some(upper) if upper < HIGHEST_TAG => Err(CommError::Startup(format!(
            "this MPI allows message tags up to {upper} (MPI_TAG_UB), kiln sends under tags up \
             to {HIGHEST_TAG}: use an MPI with a larger bound (Open MPI and MPICH allow \
             2147483647); the library: {library}"
        ))),
        // MPI must define MPI_TAG_UB; one that does not is taken at its word elsewhere.
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mpi_with_too_few_tags_is_refused_by_name() {
        assert!(check_tag_range(Some(i64::from(i32::MAX)), "Open MPI v4.1.4").is_ok());
        assert!(check_tag_range(Some(HIGHEST_TAG), "exactly enough").is_ok());
        assert!(check_tag_range(None, "silent").is_ok());
        let err = check_tag_range(Some(32767), "Tiny MPI 1.0")
            .expect_err("the standard's minimum is too small")
            .to_string();
        assert!(
            err.contains("up to 32767") && err.contains("Tiny MPI 1.0"),
            "{err}"
        );
        // The tags MpiMessages makes stay within the bound it checks.
        assert!(HIGHEST_TAG < i64::from(i32::MAX));
    }
}
