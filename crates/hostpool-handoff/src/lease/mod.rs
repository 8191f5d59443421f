//! Leasing a kept pool: what an engine's process does (`keeper = "NAME"`
//! in its config) and the protocol it speaks with the keeper (the crate
//! `hostpool-keeper`, which serves it). Apart from the keeper, so that a
//! pool's build can lease without knowing how pools are kept.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use pool_core::{Error, Result};

mod client;

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

/// How a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseEnd {
    /// Every rank released it.
    Closed,
    /// A rank's connection ended without a release: it died.
    Died,
}

/// The lease before this one: who held it and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviousLease {
    /// The process that held it (for a lease that died, the first rank that
    /// died).
    pub pid: u32,
    /// `closed` or `died`.
    pub how: LeaseEnd,
    /// When it ended (RFC 3339, UTC).
    pub ended_at: String,
}

/// A kept pool's identity, as each lease is told it (the report's `keeper`
/// object, with `attach_seconds`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The kept pool's name.
    pub name: String,
    /// The keeper's instance: changes when the keeper restarts (and the
    /// generations start again at 1).
    pub instance: String,
    /// Leases so far, this one included.
    pub generation: u64,
    /// `zero` or `keep`.
    pub content: String,
    /// The lease before this one, `None` for the first.
    pub previous: Option<PreviousLease>,
    /// The tag the previous lease stored (`keeper_tag`), `None` if it stored none.
    pub tag: Option<String>,
    /// The keeper's pid.
    pub keeper_pid: u32,
}

/// Engine → keeper.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToKeeper {
    /// Lease the pool, as rank `rank` of `world` of the engine `engine`.
    Hello {
        world: u32,
        rank: u32,
        engine: String,
        size: Option<u64>,
        page: Option<u64>,
        tag: Option<String>,
        attach_timeout_secs: f64,
        barrier_timeout_secs: f64,
    },
    /// This rank mapped the pool (or failed to, with why).
    Arrived { error: Option<String> },
    /// The lease ends cleanly.
    Release,
    /// How is the pool?
    Status,
}

/// Keeper → engine.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromKeeper {
    /// The lease: the pool's files follow, `files` in all, in this and the
    /// following [`FromKeeper::Files`] messages, each with the extents of
    /// the descriptors it carries (so that a message stays small however
    /// many files the pool has).
    Lease {
        info: LeaseInfo,
        logical: u64,
        mapped: u64,
        page: u64,
        backing: String,
        extents: Vec<(u64, u64)>,
        files: usize,
    },
    /// More descriptors of the pool's files, and their extents.
    Files { extents: Vec<(u64, u64)> },
    /// Refused (`usage`: the engine's input is at fault); `pid` is whom
    /// the message blames (the lease's holder).
    Refused {
        usage: bool,
        message: String,
        pid: Option<u32>,
    },
    /// Every rank of the lease arrived.
    Go,
    /// The lease failed: a rank failed, died or never attached.
    Failed {
        message: String,
        ranks: Vec<u32>,
        pid: Option<u32>,
    },
    /// The keeper's status.
    Status(Value),
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
