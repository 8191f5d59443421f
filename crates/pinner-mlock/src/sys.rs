//! `mlock`/`munlock`: the only `unsafe` in this crate.

#![allow(unsafe_code)]

use std::io;

use pool_core::{Region, Span};

/// `mlock` the whole region.
///
/// # Errors
/// The `mlock` errno (`ENOMEM` past `RLIMIT_MEMLOCK`, `EPERM`, `EAGAIN`).
pub fn lock(region: &Region<'_>) -> io::Result<()> {
    let len = usize::try_from(region.mapped_len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a Region keeps the whole range mapped while it is borrowed; mlock changes residency, never contents.
    unsafe { rustix::mm::mlock(region.addr().cast(), len) }.map_err(io::Error::from)
}

/// `munlock` a range that [`lock`] locked.
///
/// # Errors
/// The `munlock` errno (`ENOMEM` when the range is no longer mapped).
pub fn unlock(span: Span) -> io::Result<()> {
    let len = usize::try_from(span.len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: munlock changes only whether pages may be swapped, never their
    // contents, and on a range that is no longer mapped it fails with ENOMEM
    // rather than touching anything; the pool unpins before it unmaps.
    unsafe { rustix::mm::munlock(span.addr as *mut std::ffi::c_void, len) }.map_err(io::Error::from)
}
