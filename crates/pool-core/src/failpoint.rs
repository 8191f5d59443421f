//! Test failpoints: make a named system call fail with a chosen errno, so the
//! suite can walk error paths that a healthy machine never takes (an `EIO`
//! from the `MADV_POPULATE_WRITE` probe, a refused `mmap`).
//!
//! `HOSTPOOL_TEST_FAILPOINTS=name=action[,name=action]`, read once per
//! process; `action` is an errno, as a number or a name (`EIO`, `ENOMEM`,
//! `EINVAL`, `EPERM`, `EFAULT`), for [`check`], or `stall`, for [`stall`]:
//! the process stops there until a signal ends it, so a test can kill it at
//! that exact step. An unknown name is ignored. Without the variable every
//! check is one relaxed load of a cached empty list.

use std::io;
use std::sync::OnceLock;

/// The variable that arms failpoints.
pub const ENV: &str = "HOSTPOOL_TEST_FAILPOINTS";

/// The failpoints hostpool checks, for documentation and tests.
pub const NAMES: [&str; 7] = [
    "populate-write-probe",
    "anon-mmap",
    "shared-before-connect",
    "shared-passing-fds",
    "shared-before-ready",
    "shared-before-barrier",
    "shared-after-barrier",
];

/// What an armed failpoint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Errno(i32),
    Stall,
}

fn armed() -> &'static [(String, Action)] {
    static ARMED: OnceLock<Vec<(String, Action)>> = OnceLock::new();
    ARMED.get_or_init(|| std::env::var(ENV).map(|v| parse(&v)).unwrap_or_default())
}

fn parse(spec: &str) -> Vec<(String, Action)> {
    spec.split(',')
        .filter_map(|item| {
            let (name, action) = item.trim().split_once('=')?;
            let action = match action.trim() {
                "stall" => Action::Stall,
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

fn action(name: &str) -> Option<Action> {
    armed().iter().find(|(n, _)| n == name).map(|&(_, a)| a)
}

/// The error the failpoint `name` is armed with, if any.
pub fn check(name: &str) -> Option<io::Error> {
    match action(name)? {
        Action::Errno(errno) => Some(io::Error::from_raw_os_error(errno)),
        Action::Stall => None,
    }
}

/// Stop here for good when the failpoint `name` is armed with `stall`
/// (the test then kills the process at this step).
pub fn stall(name: &str) {
    if action(name) == Some(Action::Stall) {
        tracing::warn!("failpoint {name}: stalling until killed");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_names_and_numbers_and_skip_junk() {
        assert_eq!(
            parse(
                "populate-write-probe=EIO, anon-mmap=12,bogus,x=EWHAT,shared-after-barrier=stall"
            ),
            vec![
                ("populate-write-probe".to_string(), Action::Errno(libc::EIO)),
                ("anon-mmap".to_string(), Action::Errno(12)),
                ("shared-after-barrier".to_string(), Action::Stall),
            ]
        );
        assert!(parse("").is_empty());
    }
}
