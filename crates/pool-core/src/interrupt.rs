//! A process-wide request to stop a build: set by whatever owns the
//! process's signals (the `hostpool` CLI's signal thread, an engine's Ctrl-C
//! handler) and checked by every step of a build that can wait or take long
//! (prefault steps, the shared pool's waits and barrier), so that SIGINT,
//! SIGTERM, SIGHUP or SIGQUIT end a build within a fraction of a second at
//! any phase, by tearing down what exists, instead of after it.

use std::sync::atomic::{AtomicI32, Ordering};

use crate::error::{Error, Result};

static REQUESTED: AtomicI32 = AtomicI32::new(0);

/// Ask every build in this process to stop; `signal` is the signal number
/// (any positive number for a request that is not a signal).
pub fn request(signal: i32) {
    REQUESTED.store(signal.max(1), Ordering::SeqCst);
}

/// The signal a stop was requested with, if one was.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Forget a request (after its build was torn down).
pub fn clear() {
    REQUESTED.store(0, Ordering::SeqCst);
}

/// [`Error::Interrupted`] once a stop was requested.
///
/// # Errors
/// As said.
pub fn check() -> Result<()> {
    match requested() {
        Some(signal) => Err(Error::Interrupted { signal }),
        None => Ok(()),
    }
}
