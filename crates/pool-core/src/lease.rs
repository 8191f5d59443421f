//! What a lease of a kept pool is told and reports: the kept pool's
//! identity ([`LeaseInfo`]), how the lease before it ended, and the
//! report's `keeper` object ([`LeaseReport`]). The protocol that carries
//! them is `hostpool-handoff`'s; the plan's side of a lease is
//! [`crate::LeasePlan`].

use serde::{Deserialize, Serialize};

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
    /// The tag the previous lease stored (`lease.tag`), `None` if it stored none.
    pub tag: Option<String>,
    /// The keeper's pid.
    pub keeper_pid: u32,
    /// How many engines may lease the kept pool at once (its keeper's
    /// `--tenants`); 1 from a keeper too old to say.
    #[serde(default = "one_tenant")]
    pub tenants: u32,
}

/// What a keeper that does not say its tenant limit allows: one lease at
/// a time (as every keeper before tenants did).
fn one_tenant() -> u32 {
    1
}

/// The report's `keeper` object: the lease's [`LeaseInfo`], how long the
/// attach took, the kept pool's backing, and whose lease a companion maps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseReport {
    /// The kept pool's identity, as the keeper told it.
    #[serde(flatten)]
    pub info: LeaseInfo,
    /// Seconds from asking the keeper to the mapped pool.
    pub attach_seconds: f64,
    /// The kept pool's backing.
    pub backing: String,
    /// The engine whose lease this companion maps (`lease.companion_of`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub companion_of: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keeper too old to say its tenant limit allowed one lease at a
    /// time; a newer one says it, and the report carries it.
    #[test]
    fn a_lease_without_a_tenant_limit_reads_as_one() {
        let old = serde_json::json!({
            "name": "kv0", "instance": "i", "generation": 3, "content": "keep",
            "previous": null, "tag": null, "keeper_pid": 7,
        });
        let info: LeaseInfo = serde_json::from_value(old).unwrap();
        assert_eq!(info.tenants, 1);
        let info = LeaseInfo { tenants: 4, ..info };
        let report = LeaseReport {
            info,
            attach_seconds: 0.0,
            backing: "anon".into(),
            companion_of: None,
        };
        assert_eq!(serde_json::to_value(&report).unwrap()["tenants"], 4);
    }
}
