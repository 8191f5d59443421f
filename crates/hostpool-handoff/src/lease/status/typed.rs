//! A keeper's status, typed: what `hostpool keep status --json` prints,
//! `hostpool.keeper_status(name)` returns in Python, `hostpool doctor`
//! reports and the keeper's `/metrics` page renders. The keeper builds a
//! [`KeeperStatus`] and sends it as JSON (`Message::StatusOf`); a reader
//! parses it once ([`super::super::status_typed`]) and reads its fields,
//! never a key with a default.
//!
//! The JSON is these structs' serde form, field for field: a field's name
//! is its key. Fields added after the first status (`came_back`, `pinned`,
//! `came_back_blocks`, and the tenants', counters' and tier's) parse with
//! their default from a keeper that does not send them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use pool_core::lease::PreviousLease;

/// A keeper's status (`hostpool keep status --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeeperStatus {
    /// The kept pool's name.
    pub name: String,
    /// The keeper's socket (`@hostpool-keep.NAME`, abstract).
    pub socket: String,
    /// The keeper's pid, in its own PID namespace.
    pub pid: u32,
    /// The keeper's user.
    pub uid: u32,
    /// The keeper's instance: changes with every start.
    pub instance: String,
    /// The protocol the keeper speaks.
    pub protocol: crate::Protocol,
    /// When the keeper started (RFC 3339, UTC).
    pub started_at: String,
    /// What the keeper does now.
    pub state: KeeperState,
    /// Why the pool is broken (every lease refused until the keeper
    /// restarts); `None` while it is not.
    pub broken: Option<String>,
    /// The backing of the pool's memory.
    pub backing: String,
    /// The pool's size, bytes.
    pub size: u64,
    /// Its mapped bytes: the size rounded up to whole pages.
    pub mapped: u64,
    /// Its page size, bytes.
    pub page_size: u64,
    /// The NUMA node its memory is bound to, if any.
    pub numa_node: Option<u32>,
    /// The build's NUMA report (`pool-core`'s, as the pool's report has
    /// it).
    #[serde(default)]
    pub numa: Value,
    /// `zero` (cleared between leases) or `keep`.
    pub content: String,
    /// How the pool came to this keeper: built, or adopted with its bytes.
    #[serde(default)]
    pub came_back: CameBack,
    /// The blocks the index at the pool's tail recorded when the pool was
    /// adopted (`came_back` fdstore or persist); `None` for a pool built
    /// afresh, or one adopted without an index.
    #[serde(default)]
    pub came_back_blocks: Option<u64>,
    /// Whether the keeper pinned the pool: always `false`. A keeper never
    /// pins; each engine pins its own mapping of the pool (and unpins it
    /// when it goes), so the pages are pinned while, and as often as,
    /// engines hold them.
    #[serde(default)]
    pub pinned: bool,
    /// The users, besides the keeper's and root, that may lease the pool.
    pub allow_uids: Vec<u32>,
    /// Leases granted since the keeper started.
    pub generation: u64,
    /// The first tenant's lease (as before tenants); `None` when not leased.
    pub lease: Option<LeaseStatus>,
    /// Every tenant's lease, in the order they were granted.
    #[serde(default)]
    pub tenants: Vec<TenantStatus>,
    /// The most engines that may hold a lease at once (`--tenants`).
    #[serde(default = "one")]
    pub max_tenants: u32,
    /// Attaches waiting for the pool to be cleared.
    pub waiting: u64,
    /// How the last lease that ended ended.
    pub previous: Option<PreviousLease>,
    /// The tag of the last lease that set one.
    pub tag: Option<String>,
    /// Seconds the last clearing took.
    pub last_clear_seconds: Option<f64>,
    /// Leases that ended since the keeper started, by how.
    #[serde(default)]
    pub lease_ends: LeaseEnds,
    /// Clearings between leases that finished since the keeper started.
    #[serde(default)]
    pub clears: u64,
    /// Their seconds, summed.
    #[serde(default)]
    pub clear_seconds_total: f64,
    /// What every tenant did in the kept pool's CPU tier since the keeper
    /// started, those gone included.
    #[serde(default)]
    pub tier: TierStatus,
    /// The index an engine keeps at the pool's tail, as it is now; `None`
    /// when there is none.
    pub index: Option<IndexStatus>,
}

/// One for a keeper that said no `max_tenants` (one lease at a time).
fn one() -> u32 {
    1
}

/// What a keeper does besides serving its leases, as its status says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeeperState {
    /// No lease in force.
    #[default]
    Idle,
    /// At least one tenant holds a lease.
    Leased,
    /// Clearing the pool after the last lease ended (`content = zero`).
    Clearing,
    /// The pool could not be cleared, or a holder truncated a file: every
    /// lease is refused until the keeper restarts.
    Broken,
    /// Draining after a stop request: no new lease.
    Stopping,
}

impl KeeperState {
    /// Every state, in the order the metrics list them.
    pub const ALL: [KeeperState; 5] = [
        KeeperState::Idle,
        KeeperState::Leased,
        KeeperState::Clearing,
        KeeperState::Broken,
        KeeperState::Stopping,
    ];

    /// Its name in the status and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            KeeperState::Idle => "idle",
            KeeperState::Leased => "leased",
            KeeperState::Clearing => "clearing",
            KeeperState::Broken => "broken",
            KeeperState::Stopping => "stopping",
        }
    }
}

impl std::fmt::Display for KeeperState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a keeper's pool came to it: built, or adopted from a keeper that ran
/// before (its memory, bytes and index as they were).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CameBack {
    /// Built afresh.
    #[default]
    Built,
    /// Handed back by systemd's file descriptor store (`LISTEN_FDS`).
    FdStore,
    /// Found in its persist directory (`persist = "DIR"`).
    Persist,
    /// Handed back by a tenant that lived through the keeper before
    /// (`adopt_within_secs`).
    Tenants,
}

impl CameBack {
    /// Every way, in the order the metrics list them.
    pub const ALL: [CameBack; 4] = [
        CameBack::Built,
        CameBack::FdStore,
        CameBack::Persist,
        CameBack::Tenants,
    ];

    /// Its name in the status and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            CameBack::Built => "built",
            CameBack::FdStore => "fdstore",
            CameBack::Persist => "persist",
            CameBack::Tenants => "tenants",
        }
    }
}

/// A lease in force, as the status's `lease` shows the first tenant's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// Its first rank's pid (the pid that names the lease).
    pub pid: Option<u32>,
    /// Its first rank's user.
    pub uid: Option<u32>,
    /// When it was granted (RFC 3339, UTC).
    pub since: String,
    /// The engine's id (`""`: an engine without one).
    pub engine: String,
    /// Its ranks.
    pub world: u32,
    /// Its generation (the tenant's id).
    pub generation: u64,
    /// Every rank attached and arrived.
    pub live: bool,
    /// Its ranks attached now.
    pub ranks: Vec<RankStatus>,
    /// Its companions attached now (vLLM's scheduler, say).
    #[serde(default)]
    pub companions: Vec<CompanionStatus>,
}

/// One tenant of a kept pool: an entry of the status's `tenants`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantStatus {
    /// The engine's id (`""`: an engine without one).
    pub engine: String,
    /// The pids of its attached processes: ranks, then companions.
    pub pids: Vec<u32>,
    /// Its ranks attached now.
    pub ranks: Vec<RankStatus>,
    /// Its companions attached now.
    pub companions: Vec<CompanionStatus>,
    /// Its ranks.
    pub world: u32,
    /// When its lease was granted (RFC 3339, UTC).
    pub since: String,
    /// Its lease's generation.
    pub generation: u64,
    /// Every rank attached and arrived.
    pub live: bool,
    /// The tag its lease set, if any.
    pub tag: Option<String>,
    /// Blocks it stored in the CPU tier.
    #[serde(default)]
    pub stored: u64,
    /// Blocks it read from the CPU tier.
    #[serde(default)]
    pub hits: u64,
    /// Of those, blocks another tenant (or an earlier lease) stored.
    #[serde(default)]
    pub hits_from_others: u64,
}

/// A rank of a lease, attached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankStatus {
    pub rank: u32,
    pub pid: u32,
    pub uid: u32,
}

/// A companion of a lease, attached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompanionStatus {
    pub pid: u32,
    pub uid: u32,
}

/// Leases that ended since the keeper started, by how.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseEnds {
    /// With every process released.
    pub closed: u64,
    /// With a process dead.
    pub died: u64,
}

/// What every tenant did in the kept pool's CPU tier since the keeper
/// started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierStatus {
    /// Blocks stored.
    pub stored: u64,
    /// Blocks read.
    pub hits: u64,
    /// Of those, blocks a tenant read that another tenant (or an earlier
    /// lease) stored.
    pub hits_from_others: u64,
    /// Opens of the tier by a tenant, by how it started.
    #[serde(default)]
    pub opens: TierOpens,
}

/// Opens of the CPU tier by a tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierOpens {
    /// Its blocks found (its identity's index): a restore.
    pub warm: u64,
    /// Started cold.
    pub cold: u64,
}

/// The index an engine keeps at the pool's tail (`Pool.index`), as the
/// keeper reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexStatus {
    /// Its slots.
    pub slots: u64,
    /// The blocks it records (whole records only).
    pub records: u64,
    /// The digest of its fingerprint.
    pub digest: String,
    /// The model its fingerprint names, if any.
    pub model: Option<String>,
}

impl KeeperStatus {
    /// The status a keeper of `name` sent, parsed.
    ///
    /// # Errors
    /// [`pool_core::Error::Keeper`] naming the keeper (and `pid`, its pid
    /// as this process sees it) when `value` is not a keeper's status.
    pub fn from_value(name: &str, value: Value, pid: Option<u32>) -> pool_core::Result<Self> {
        serde_json::from_value(value).map_err(|e| {
            crate::kept::keeper_error(
                name,
                format!(
                    "the keeper of `{name}`{} sent a status this hostpool cannot read ({e}); is \
                     it of another hostpool version? `hostpool keep status --name {name} --json` \
                     prints what it sent",
                    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
                ),
                pid,
                false,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A status as a keeper sends it, every field.
    fn sent() -> Value {
        json!({
            "name": "kv0", "socket": "@hostpool-keep.kv0", "pid": 10, "uid": 0,
            "instance": "abc", "protocol": {"version": 3, "oldest": 1},
            "started_at": "2025-01-01T00:00:00Z", "state": "leased", "broken": null,
            "backing": "anon", "size": 1024, "mapped": 4096, "page_size": 4096,
            "numa_node": 1, "numa": {"node": 1}, "content": "keep", "came_back": "fdstore",
            "came_back_blocks": 7, "pinned": false, "allow_uids": [1234], "generation": 2,
            "lease": {"pid": 100, "uid": 0, "since": "2025-01-01T00:00:01Z", "engine": "a",
                      "world": 1, "generation": 2, "live": true,
                      "ranks": [{"rank": 0, "pid": 100, "uid": 0}],
                      "companions": [{"pid": 101, "uid": 0}]},
            "tenants": [{"engine": "a", "pids": [100, 101],
                         "ranks": [{"rank": 0, "pid": 100, "uid": 0}],
                         "companions": [{"pid": 101, "uid": 0}], "world": 1,
                         "since": "2025-01-01T00:00:01Z", "generation": 2, "live": true,
                         "tag": null, "stored": 3, "hits": 2, "hits_from_others": 1}],
            "max_tenants": 2, "waiting": 0,
            "previous": {"pid": 90, "how": "died", "ended_at": "2025-01-01T00:00:00Z"},
            "tag": "t", "last_clear_seconds": 0.25,
            "lease_ends": {"closed": 0, "died": 1}, "clears": 1, "clear_seconds_total": 0.25,
            "tier": {"stored": 3, "hits": 2, "hits_from_others": 1,
                     "opens": {"warm": 1, "cold": 0}},
            "index": {"slots": 8, "records": 7, "digest": "d", "model": null},
        })
    }

    #[test]
    fn a_status_reads_and_writes_back_the_same_json() {
        let s = KeeperStatus::from_value("kv0", sent(), None).unwrap();
        assert_eq!(s.state, KeeperState::Leased);
        assert_eq!(s.came_back, CameBack::FdStore);
        assert_eq!(s.came_back_blocks, Some(7));
        assert_eq!(
            s.tenants[0].companions,
            vec![CompanionStatus { pid: 101, uid: 0 }]
        );
        assert_eq!(s.index.as_ref().map(|i| i.records), Some(7));
        assert_eq!(serde_json::to_value(&s).unwrap(), sent());
    }

    #[test]
    fn an_older_keepers_status_reads_with_defaults_and_garbage_names_the_keeper() {
        let mut old = sent();
        let m = old.as_object_mut().unwrap();
        for key in [
            "came_back",
            "came_back_blocks",
            "pinned",
            "tenants",
            "max_tenants",
            "lease_ends",
            "clears",
            "clear_seconds_total",
            "tier",
        ] {
            m.remove(key);
        }
        let s = KeeperStatus::from_value("kv0", old, None).unwrap();
        assert_eq!(
            (s.came_back, s.came_back_blocks, s.pinned, s.max_tenants),
            (CameBack::Built, None, false, 1)
        );
        assert!(s.tenants.is_empty());
        let e = KeeperStatus::from_value("kv0", json!({"name": 1}), Some(42)).unwrap_err();
        assert!(
            e.to_string()
                .contains("the keeper of `kv0` (pid 42) sent a status this hostpool cannot read"),
            "{e}"
        );
    }

    #[test]
    fn states_and_ways_back_are_named_as_their_json() {
        for st in KeeperState::ALL {
            assert_eq!(serde_json::to_value(st).unwrap(), json!(st.name()));
        }
        for c in CameBack::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), json!(c.name()));
        }
    }
}
