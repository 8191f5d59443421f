//! Termination-signal handling that keeps xtask alive long enough to restore
//! the machine.
//!
//! [`install`] blocks SIGINT, SIGTERM and SIGHUP in the main thread before any
//! other thread exists (so every thread inherits the mask) and starts a
//! watcher thread that takes them with `sigwait(3)`. The signals therefore
//! never kill xtask; instead the watcher
//!
//! * records the signal (see [`received`]), so that xtask stops at the next
//!   step and its RAII guards restore the machine, and
//! * forwards it to the process group of the running child (see
//!   [`ChildGroup`]), so `cargo test` and the test binaries it started stop
//!   too. A third signal is forwarded as SIGKILL for children that ignore the
//!   first two.
//!
//! Children start with an empty signal mask (`std::process::Command` resets
//! the mask before `exec`) and with the default actions for these signals
//! (see [`reset_dispositions`]), so none of this leaks into `cargo`.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crate::sys::{self, SigSet};

/// The signals xtask intercepts.
const HANDLED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Number of the most recent intercepted signal, 0 if none yet.
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// How many intercepted signals arrived so far.
static SIGNAL_COUNT: AtomicU32 = AtomicU32::new(0);
/// Process group id of the running child, 0 if none.
static CHILD_PGID: AtomicI32 = AtomicI32::new(0);

/// Blocks [`HANDLED`] and starts the watcher thread.
///
/// Must be called first thing in `main`, before any thread is spawned.
pub fn install() -> Result<(), String> {
    let set = handled_set()?;
    // No other thread exists yet, so the mask is inherited by every thread
    // spawned later.
    sys::block(&set)
        .map_err(|err| format!("could not block SIGINT/SIGTERM/SIGHUP (pthread_sigmask: {err})"))?;
    reset_dispositions()?;
    std::thread::Builder::new()
        .name("xtask-signals".into())
        .spawn(move || watch(set))
        .map_err(|err| format!("could not start the signal watcher thread: {err}"))?;
    Ok(())
}

/// Sets [`HANDLED`] back to their default action. They are blocked, so
/// this only matters for children: a parent such as a non-interactive shell
/// running xtask in the background leaves SIGINT ignored, and ignored signals
/// stay ignored across `exec`, which would make `cargo test` deaf to the
/// SIGINT that xtask forwards.
fn reset_dispositions() -> Result<(), String> {
    for sig in HANDLED {
        sys::reset_to_default(sig)
            .map_err(|err| format!("could not reset the action of {}: {err}", name(sig)))?;
    }
    Ok(())
}

/// Builds the signal set containing [`HANDLED`].
fn handled_set() -> Result<SigSet, String> {
    SigSet::new(&HANDLED).map_err(|err| format!("could not build the signal set: {err}"))
}

/// Watcher thread body: takes blocked signals forever.
fn watch(set: SigSet) {
    loop {
        if let Ok(sig) = sys::wait(&set) {
            on_signal(sig);
        }
    }
}

/// Records `sig` and forwards it to the running child's process group.
fn on_signal(sig: libc::c_int) {
    let count = SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    let pgid = CHILD_PGID.load(Ordering::SeqCst);
    if pgid == 0 {
        eprintln!("xtask: received {}; stopping and restoring", name(sig));
        return;
    }
    let forward = if count >= 3 { libc::SIGKILL } else { sig };
    eprintln!(
        "xtask: received {}; sending {} to the child (process group {pgid}), restoring afterwards",
        name(sig),
        name(forward)
    );
    signal_group(pgid, forward);
}

/// Sends `sig` to every process in process group `pgid`.
pub fn signal_group(pgid: i32, sig: libc::c_int) {
    // The negative pid addresses the process group that xtask created for
    // its own child; a group that is already gone is not an error here.
    let _ = sys::kill(-pgid, sig);
}

/// The most recent intercepted signal, if any arrived.
pub fn received() -> Option<libc::c_int> {
    match LAST_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Exit status conventionally used after being stopped by `sig`.
pub fn exit_code_for(sig: libc::c_int) -> i32 {
    128 + sig
}

/// Human-readable name of the signals xtask deals with.
pub fn name(sig: libc::c_int) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        other => format!("signal {other}"),
    }
}

/// Registration of the running child's process group as the target for
/// forwarded signals; unregisters on drop.
pub struct ChildGroup(());

impl ChildGroup {
    /// Makes `pgid` the forwarding target. A signal that arrived between
    /// spawning the child and this call is forwarded now.
    pub fn register(pgid: i32) -> Self {
        CHILD_PGID.store(pgid, Ordering::SeqCst);
        if let Some(sig) = received() {
            signal_group(pgid, sig);
        }
        ChildGroup(())
    }
}

impl Drop for ChildGroup {
    fn drop(&mut self) {
        CHILD_PGID.store(0, Ordering::SeqCst);
    }
}
