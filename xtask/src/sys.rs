//! The only `unsafe` code of xtask: the libc signal calls behind
//! [`crate::signals`], and `geteuid`, each behind a safe wrapper.

#![allow(unsafe_code)]

use std::io;

use libc::c_int;

/// A set of signals (`sigset_t`), always initialised.
#[derive(Clone, Copy)]
pub struct SigSet(libc::sigset_t);

impl SigSet {
    /// `sigemptyset`, then `sigaddset` of each of `signals`.
    ///
    /// # Errors
    /// The errno of the first call that failed (`EINVAL` for a bad signal
    /// number).
    pub fn new(signals: &[c_int]) -> io::Result<SigSet> {
        // SAFETY: sigset_t is a plain array of integers, so all-zero bytes are
        // a valid value; sigemptyset/sigaddset only write through the pointer
        // to this local, which is valid for the whole block.
        let (set, ok) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut ok = libc::sigemptyset(&raw mut set) == 0;
            for &sig in signals {
                ok &= libc::sigaddset(&raw mut set, sig) == 0;
            }
            (set, ok)
        };
        if ok {
            Ok(SigSet(set))
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// `pthread_sigmask(SIG_BLOCK, set, NULL)`: block `set` in the calling
/// thread; threads it spawns later inherit the mask.
///
/// # Errors
/// The error number `pthread_sigmask` returns.
pub fn block(set: &SigSet) -> io::Result<()> {
    // SAFETY: `set.0` is a fully initialised sigset_t that lives across the
    // call; a null `oldset` is allowed.
    let rc =
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set.0, std::ptr::null_mut()) };
    match rc {
        0 => Ok(()),
        rc => Err(io::Error::from_raw_os_error(rc)),
    }
}

/// `signal(sig, SIG_DFL)`: give `sig` its default action.
///
/// # Errors
/// `errno` when `signal` returns `SIG_ERR` (`EINVAL` for a bad or
/// uncatchable signal number).
pub fn reset_to_default(sig: c_int) -> io::Result<()> {
    // SAFETY: installs the default action, so no handler code of this process
    // ever runs for `sig`; an invalid number only makes the call fail.
    let previous = unsafe { libc::signal(sig, libc::SIG_DFL) };
    if previous == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `sigwait(set)`: wait until a signal of `set` is pending and take it;
/// returns its number. The signals must be blocked in every thread.
///
/// # Errors
/// The error number `sigwait` returns.
pub fn wait(set: &SigSet) -> io::Result<c_int> {
    let mut sig: c_int = 0;
    // SAFETY: `set.0` is an initialised sigset_t and `sig` a valid, writable
    // c_int; both outlive the call.
    let rc = unsafe { libc::sigwait(&raw const set.0, &raw mut sig) };
    match rc {
        0 => Ok(sig),
        rc => Err(io::Error::from_raw_os_error(rc)),
    }
}

/// `kill(pid, sig)`; a negative `pid` addresses process group `-pid`.
///
/// # Errors
/// `errno` (`ESRCH` when no such process or group exists).
pub fn kill(pid: i32, sig: c_int) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions: it takes two
    // integers and touches no memory of this process.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `geteuid()`: the effective user id of this process (0 for root).
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) takes no arguments, touches no memory of this
    // process and always succeeds.
    unsafe { libc::geteuid() }
}
