//! Leasing a kept pool: what an engine's process does (`[lease]` in its
//! config) and the protocol it speaks with the keeper (the crate
//! `hostpool-keeper`, which serves it). Apart from the keeper, so that a
//! pool's build can lease without knowing how pools are kept.

use serde_json::Value;

use pool_core::Result;

mod client;
mod hand_back;
mod status;
pub mod tier;

pub use crate::message::{LeaseEnd, LeaseInfo, PreviousLease};

pub use crate::kept::{SOCKET_PREFIX, address, how_to_start, keeper_error, socket_name};
pub use client::attach;
pub use hand_back::hand_back;
pub use status::{
    CameBack, CompanionStatus, IndexStatus, KeeperState, KeeperStatus, LeaseEnds, LeaseStatus,
    RankStatus, TenantStatus, TierOpens, TierStatus,
};
pub use tier::{LinkState, TierLink, Unanswered};

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

/// Ask the keeper of `name` how its pool is (`hostpool keep status`), as
/// the JSON it sent (Python's `hostpool.keeper_status`); [`status_typed`]
/// parses it.
///
/// # Errors
/// [`pool_core::Error::Keeper`] when no keeper answers or it refuses.
pub fn status(name: &str) -> Result<Value> {
    status::status(name).map(|(v, _)| v)
}

/// [`status`], with the keeper's pid as this process sees it
/// (`SO_PEERCRED`): the status's own `pid` is the keeper's in its PID
/// namespace, this one is in ours (0 when the keeper's namespace is not
/// visible from ours), for reading its `/proc/PID` entries.
///
/// # Errors
/// As [`status`].
pub fn status_and_pid(name: &str) -> Result<(Value, u32)> {
    status::status(name)
}

/// [`status`], parsed: the keeper's [`KeeperStatus`].
///
/// # Errors
/// As [`status`]; [`pool_core::Error::Keeper`] naming the keeper when what
/// it sent is not a keeper's status (a keeper of another version).
pub fn status_typed(name: &str) -> Result<KeeperStatus> {
    status::status_typed(name).map(|(s, _)| s)
}

/// [`status_and_pid`], parsed: the keeper's [`KeeperStatus`] and its pid as
/// this process sees it.
///
/// # Errors
/// As [`status_typed`].
pub fn status_and_pid_typed(name: &str) -> Result<(KeeperStatus, u32)> {
    status::status_typed(name)
}
