//! The only `unsafe` of the keeper: taking ownership of the descriptors
//! systemd passed at exec (`LISTEN_FDS`), which no Rust value owns yet.

#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the passed descriptors were taken: at most once a process.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The descriptors `first..first + count` as owned, the first time this is
/// called in the process; `None` after (they are someone's already).
/// Each is made close-on-exec.
pub(crate) fn take_passed(first: RawFd, count: u32) -> Option<Vec<OwnedFd>> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return None;
    }
    let fds = (0..count)
        .filter_map(|i| i32::try_from(i).ok().map(|i| first + i))
        // Only descriptors that are open: a count larger than what was
        // passed takes nothing that is not there.
        .filter(|fd| {
            // SAFETY: `fd` is only borrowed for one fcntl, and only while
            // open (F_GETFD fails with EBADF otherwise).
            let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) };
            rustix::io::fcntl_getfd(borrowed).is_ok()
        })
        .map(|fd| {
            // SAFETY: systemd passed `fd` to this process at exec for it to
            // own (sd_listen_fds(3)): the number was taken from exec on, so
            // no open of this process got it, and `TAKEN` makes this the one
            // owner of it.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
            owned
        })
        .collect();
    Some(fds)
}
