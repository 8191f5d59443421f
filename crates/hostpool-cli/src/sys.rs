//! Signal handling for `alloc`, and for the `serve-refusal` helper its
//! failed creator starts, which takes a descriptor inherited across `exec`:
//! the only `unsafe` in the facade.

#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, blocked in every thread so that one
/// thread's `sigwait` receives them.
#[derive(Debug)]
pub struct TerminationSignals {
    set: libc::sigset_t,
}

impl TerminationSignals {
    /// Block SIGINT, SIGTERM, SIGHUP and SIGQUIT in the calling thread;
    /// threads started later inherit the mask. Call before any thread is
    /// spawned.
    pub fn block() -> io::Result<TerminationSignals> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set it is given; sigaddset and
        // pthread_sigmask read the initialised set. No other thread sees it.
        unsafe {
            if libc::sigemptyset(set.as_mut_ptr()) != 0
                || libc::sigaddset(set.as_mut_ptr(), libc::SIGINT) != 0
                || libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM) != 0
                || libc::sigaddset(set.as_mut_ptr(), libc::SIGHUP) != 0
                || libc::sigaddset(set.as_mut_ptr(), libc::SIGQUIT) != 0
            {
                return Err(io::Error::last_os_error());
            }
            let set = set.assume_init();
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            Ok(TerminationSignals { set })
        }
    }

    /// Wait until one of the signals arrives; returns the signal number.
    pub fn wait(&self) -> io::Result<i32> {
        let mut sig = 0;
        // SAFETY: `self.set` is an initialised signal set and `sig` a valid
        // out-pointer for the duration of the call.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(sig)
    }
}

/// Unblock every signal in the calling thread
/// (`pthread_sigmask(SIG_SETMASK, {})`), and so in the threads it starts
/// later: a process that `alloc` started inherits its blocked SIGINT,
/// SIGTERM, SIGHUP and SIGQUIT (exec keeps the mask, and std's `Command`
/// does not clear it), and would not die of them.
///
/// # Errors
/// The `pthread_sigmask` errno.
pub fn unblock_all_signals() -> io::Result<()> {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given; pthread_sigmask
    // reads the initialised set, and takes a null old-set pointer.
    unsafe {
        if libc::sigemptyset(set.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let set = set.assume_init();
        let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

// SAFETY: a sigset_t is plain data; `wait` only reads it, from whichever
// thread owns the value.
unsafe impl Send for TerminationSignals {}

/// Take descriptor `fd`, which this process inherited across `exec` from
/// the process that started it, and mark it close-on-exec (so it goes no
/// further).
///
/// Every descriptor that std and rustix open has `FD_CLOEXEC`: one that is
/// open and lacks it was inherited, and nothing in this process owns it. So
/// `fd` is refused when it is standard input, output or error (std's), when
/// it is not open (`fcntl(F_GETFD)` fails: `EBADF`), or when it has
/// `FD_CLOEXEC` (this process opened it, or it was taken already:
/// `EBADF`). Call it before starting any thread.
///
/// # Errors
/// `EBADF` as above; the `fcntl(F_SETFD)` errno.
pub fn inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd <= libc::STDERR_FILENO {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: F_GETFD reads the descriptor flags of any number; one that is
    // not open is EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::FD_CLOEXEC != 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: `fd` is open (F_GETFD succeeded) and lacks FD_CLOEXEC, which
    // every descriptor std and rustix open in this process has: it came
    // across exec and has no other owner here. It gets FD_CLOEXEC at once,
    // so a second call refuses it instead of owning it twice.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}
