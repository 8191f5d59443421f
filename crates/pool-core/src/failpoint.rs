//! Test failpoints: make a named system call fail with a chosen errno, so the
//! suite can walk error paths that a healthy machine never takes (an `EIO`
//! from the `MADV_POPULATE_WRITE` probe, a refused `mmap`).
//!
//! `HOSTPOOL_TEST_FAILPOINTS=name=errno[,name=errno]`, read once per
//! process; `errno` is a number or a name (`EIO`, `ENOMEM`, `EINVAL`,
//! `EPERM`, `EFAULT`). An unknown name is ignored. Without the variable
//! every check is one relaxed load of a cached empty list.

use std::io;
use std::sync::OnceLock;

/// The variable that arms failpoints.
pub const ENV: &str = "HOSTPOOL_TEST_FAILPOINTS";

/// The failpoints hostpool checks, for documentation and tests.
pub const NAMES: [&str; 2] = ["populate-write-probe", "anon-mmap"];

fn armed() -> &'static [(String, i32)] {
    static ARMED: OnceLock<Vec<(String, i32)>> = OnceLock::new();
    ARMED.get_or_init(|| std::env::var(ENV).map(|v| parse(&v)).unwrap_or_default())
}

fn parse(spec: &str) -> Vec<(String, i32)> {
    spec.split(',')
        .filter_map(|item| {
            let (name, errno) = item.trim().split_once('=')?;
            let errno = match errno.trim() {
                "EIO" => libc::EIO,
                "ENOMEM" => libc::ENOMEM,
                "EINVAL" => libc::EINVAL,
                "EPERM" => libc::EPERM,
                "EFAULT" => libc::EFAULT,
                n => n.parse().ok()?,
            };
            Some((name.trim().to_string(), errno))
        })
        .collect()
}

/// The error the failpoint `name` is armed with, if any.
pub fn check(name: &str) -> Option<io::Error> {
    armed()
        .iter()
        .find(|(n, _)| n == name)
        .map(|&(_, errno)| io::Error::from_raw_os_error(errno))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_names_and_numbers_and_skip_junk() {
        assert_eq!(
            parse("populate-write-probe=EIO, anon-mmap=12,bogus,x=EWHAT"),
            vec![
                ("populate-write-probe".to_string(), libc::EIO),
                ("anon-mmap".to_string(), 12)
            ]
        );
        assert!(parse("").is_empty());
    }
}
