//! Leasing a kept pool: what an engine's process does (`keeper = "NAME"`
//! in its config) and the protocol it speaks with the keeper (the crate
//! `hostpool-keeper`, which serves it). Apart from the keeper, so that a
//! pool's build can lease without knowing how pools are kept.

use serde_json::Value;

use pool_core::{Error, Result};

mod client;

pub use crate::message::{LeaseEnd, LeaseInfo, PreviousLease};

pub use client::attach;

/// The prefix of every keeper's abstract socket name.
pub const SOCKET_PREFIX: &str = "hostpool-keep/";

/// The abstract socket a kept pool is served on, as `ss -x` and
/// `/proc/net/unix` show it: `@hostpool-keep/<name>`.
pub fn socket_name(name: &str) -> String {
    format!("@{SOCKET_PREFIX}{name}")
}

pub fn address(name: &str) -> Result<rustix::net::SocketAddrUnix> {
    rustix::net::SocketAddrUnix::new_abstract_name(format!("{SOCKET_PREFIX}{name}").as_bytes())
        .map_err(|e| {
            crate::wire::os(
                "socket address",
                e,
                "the kept pool's name is too long for a socket name",
            )
        })
}

/// The names of the kept pools this network namespace serves, from
/// `/proc/net/unix` (every keeper, whoever runs it).
pub fn list() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@')?.strip_prefix(SOCKET_PREFIX))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Ask the keeper of `name` how its pool is (`hostpool keep status`).
///
/// # Errors
/// [`Error::Keeper`] when no keeper answers or it refuses.
pub fn status(name: &str) -> Result<Value> {
    client::status(name)
}

/// The keeper error for `name`: `message`, blaming `pid` when known.
pub fn keeper_error(name: &str, message: String, pid: Option<u32>, absent: bool) -> Error {
    Error::Keeper {
        name: name.to_string(),
        message,
        pid,
        absent,
    }
}

/// Where a kept pool's socket is, for messages.
pub fn how_to_start(name: &str) -> String {
    format!(
        "start it (`hostpool keep --name {name} --size SIZE`, or `systemctl start \
         hostpool-keep@{name}`) in this network namespace (a Kubernetes pod shares one), or set \
         keeper_fallback = \"build\" to build a pool of this process's own"
    )
}
