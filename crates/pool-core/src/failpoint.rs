//! Test failpoints: make a named system call fail with a chosen errno, so the
//! suite can walk error paths that a healthy machine never takes (an `EIO`
//! from the `MADV_POPULATE_WRITE` probe, a refused `mmap`).
//!
//! `HOSTPOOL_TEST_FAILPOINTS=name=action[,name=action]`, read once per
//! process; `action` is an errno, as a number or a name (`EIO`, `ENOMEM`,
//! `EINVAL`, `EPERM`, `EFAULT`), for [`check`], or `stall`, for [`stall`]:
//! the process stops there until a signal ends it, so a test can kill it at
//! that exact step; or `stop`, also for [`stall`]: the process stops itself
//! with `SIGSTOP` there, so a test that sees it stopped (its state in
//! `/proc/PID/stat`) can change the world under it, then let it go on with
//! `SIGCONT`. An unknown name is ignored. Without the variable every
//! check is one relaxed load of a cached empty list.
//!
//! Only a build with the cargo feature `failpoints` reads the variable (the
//! tests turn it on, as fail-rs does): in any other build [`check`] and
//! [`stall`] are empty, inlined away, and the variable's name is not in the
//! binary. `cargo xtask test` runs the release binary with a failpoint armed
//! and checks that it is ignored.

use std::io;
#[cfg(feature = "failpoints")]
use std::sync::OnceLock;

/// Whether this build reads `HOSTPOOL_TEST_FAILPOINTS` (the cargo feature
/// `failpoints`).
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// The variable that arms failpoints, in a build with the feature.
#[cfg(feature = "failpoints")]
pub const ENV: &str = "HOSTPOOL_TEST_FAILPOINTS";

/// The failpoints hostpool checks, for documentation and tests.
pub const NAMES: [&str; 18] = [
    "populate-write-probe",
    "anon-mmap",
    "shared-creator-map",
    "shared-before-connect",
    "shared-passing-fds",
    "shared-before-ready",
    "shared-before-barrier",
    "shared-after-barrier",
    "keeper-before-build",
    "keeper-hello",
    "keeper-passing-fds",
    "keeper-leased",
    "keeper-lease-end",
    "keeper-zeroing",
    "keeper-clear",
    "keeper-before-connect",
    "keeper-attached",
    "keeper-release",
];

/// What an armed failpoint does.
#[cfg(feature = "failpoints")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Errno(i32),
    Stall,
    Stop,
}

#[cfg(feature = "failpoints")]
fn armed() -> &'static [(String, Action)] {
    static ARMED: OnceLock<Vec<(String, Action)>> = OnceLock::new();
    ARMED.get_or_init(|| std::env::var(ENV).map(|v| parse(&v)).unwrap_or_default())
}

#[cfg(feature = "failpoints")]
fn parse(spec: &str) -> Vec<(String, Action)> {
    spec.split(',')
        .filter_map(|item| {
            let (name, action) = item.trim().split_once('=')?;
            let action = match action.trim() {
                "stall" => Action::Stall,
                "stop" => Action::Stop,
                "EIO" => Action::Errno(libc::EIO),
                "ENOMEM" => Action::Errno(libc::ENOMEM),
                "EINVAL" => Action::Errno(libc::EINVAL),
                "EPERM" => Action::Errno(libc::EPERM),
                "EFAULT" => Action::Errno(libc::EFAULT),
                n => Action::Errno(n.parse().ok()?),
            };
            Some((name.trim().to_string(), action))
        })
        .collect()
}

#[cfg(feature = "failpoints")]
fn action(name: &str) -> Option<Action> {
    armed().iter().find(|(n, _)| n == name).map(|&(_, a)| a)
}

/// The error the failpoint `name` is armed with, if any.
#[cfg(feature = "failpoints")]
pub fn check(name: &str) -> Option<io::Error> {
    match action(name)? {
        Action::Errno(errno) => Some(io::Error::from_raw_os_error(errno)),
        Action::Stall | Action::Stop => None,
    }
}

/// No failpoint is ever armed in a build without the feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn check(_name: &str) -> Option<io::Error> {
    None
}

/// Stop here for good when the failpoint `name` is armed with `stall`
/// (the test then kills the process at this step), or until `SIGCONT` when
/// it is armed with `stop` (the process stops itself with `SIGSTOP`).
#[cfg(feature = "failpoints")]
pub fn stall(name: &str) {
    match action(name) {
        Some(Action::Stall) => {
            tracing::warn!("failpoint {name}: stalling until killed");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        Some(Action::Stop) => {
            tracing::warn!("failpoint {name}: stopped until SIGCONT");
            let me = rustix::process::getpid();
            let _ = rustix::process::kill_process(me, rustix::process::Signal::STOP);
        }
        _ => {}
    }
}

/// No failpoint is ever armed in a build without the feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn stall(_name: &str) {}

/// Sleep for the milliseconds the variable `var` holds, if it holds a
/// number (the CLI's `HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS`).
#[cfg(feature = "failpoints")]
pub fn delay(var: &str) {
    if let Some(ms) = std::env::var(var).ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// No failpoint is ever armed in a build without the feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn delay(_var: &str) {}

/// The variable that moves the root of sysfs, and where sysfs is: the node
/// facts' (`hostpool-node`, whose `failpoints` feature this crate's turns
/// on).
#[cfg(feature = "failpoints")]
pub use hostpool_node::SYSFS_ROOT_ENV;
pub use hostpool_node::sysfs_root;

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_names_and_numbers_and_skip_junk() {
        assert_eq!(
            parse(
                "populate-write-probe=EIO, anon-mmap=12,bogus,x=EWHAT,shared-after-barrier=stall,\
                 keeper-attached=stop"
            ),
            vec![
                ("populate-write-probe".to_string(), Action::Errno(libc::EIO)),
                ("anon-mmap".to_string(), Action::Errno(12)),
                ("shared-after-barrier".to_string(), Action::Stall),
                ("keeper-attached".to_string(), Action::Stop),
            ]
        );
        assert!(parse("").is_empty());
    }
}
