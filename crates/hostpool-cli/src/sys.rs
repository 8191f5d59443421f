//! Signal handling for `alloc`: the only `unsafe` in the facade.

#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;

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

// SAFETY: a sigset_t is plain data; `wait` only reads it, from whichever
// thread owns the value.
unsafe impl Send for TerminationSignals {}
