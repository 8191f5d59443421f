//! Stopping a build: a [`Cancel`] token, made by whoever owns the build and
//! handed to it ([`crate::BuildOptions`]), cancelled by whoever
//! owns the signals (the `hostpool` CLI's signal thread cancels the token of
//! its one build; the Python package cancels the token of the build whose
//! thread received Ctrl-C) and checked by every step of that build that can
//! wait or take long (prefault steps, the shared pool's waits and barrier, a
//! lease's waits), so that SIGINT, SIGTERM, SIGHUP or SIGQUIT end a build
//! within a fraction of a second at any phase, by tearing down what exists,
//! instead of after it.
//!
//! A token belongs to the builds it was handed to and to nothing else: two
//! builds in one process, each with its own token, are cancelled one
//! without the other. Nothing here is process-wide.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::error::{Error, Result};

/// A request to stop the builds that hold this token (or a clone of it).
/// Clones share the request; [`Cancel::default`] is a new token that
/// nothing has cancelled.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicI32>);

impl Cancel {
    /// A token nothing has cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Ask every build holding this token to stop; `signal` is the signal
    /// number (any positive number for a request that is not a signal).
    /// The first request is the one kept.
    pub fn cancel(&self, signal: i32) {
        let _ = self
            .0
            .compare_exchange(0, signal.max(1), Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The signal a stop was requested with, if one was.
    pub fn requested(&self) -> Option<i32> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// [`Error::Interrupted`] once a stop was requested.
    ///
    /// # Errors
    /// As said.
    pub fn check(&self) -> Result<()> {
        match self.requested() {
            Some(signal) => Err(Error::Interrupted { signal }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_shared_by_its_clones_and_by_nothing_else() {
        let a = Cancel::new();
        let a2 = a.clone();
        let b = Cancel::new();
        assert!(a.check().is_ok() && b.check().is_ok());
        a2.cancel(libc::SIGTERM);
        assert_eq!(a.requested(), Some(libc::SIGTERM));
        assert!(matches!(
            a.check(),
            Err(Error::Interrupted { signal }) if signal == libc::SIGTERM
        ));
        assert_eq!(b.requested(), None, "another build's token is untouched");
        // The first request is kept; a request that is no signal is 1.
        a.cancel(libc::SIGINT);
        assert_eq!(a2.requested(), Some(libc::SIGTERM));
        b.cancel(0);
        assert_eq!(b.requested(), Some(1));
    }
}
