//! `mlock`/`munlock`: the only `unsafe` in this crate.

use std::io;

use pool_core::Region;

/// `mlock` the whole region.
///
/// # Errors
/// The `mlock` errno (`ENOMEM` past `RLIMIT_MEMLOCK`, `EPERM`, `EAGAIN`).
pub fn lock(region: &Region) -> io::Result<()> {
    let len = usize::try_from(region.mapped_len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `Region::new`'s contract keeps the whole range mapped while the
    // region is used; mlock changes residency, never contents.
    unsafe { rustix::mm::mlock(region.addr().cast(), len) }.map_err(io::Error::from)
}

/// `munlock` the whole region.
///
/// # Errors
/// The `munlock` errno.
pub fn unlock(region: &Region) -> io::Result<()> {
    let len = usize::try_from(region.mapped_len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: as for `lock`; the pool unpins before it unmaps.
    unsafe { rustix::mm::munlock(region.addr().cast(), len) }.map_err(io::Error::from)
}
