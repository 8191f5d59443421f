//! Capacity checks: can the node hold the pool, before anything is mapped.
//!
//! Each check says what it read, how much the pool needs, how much is free,
//! its verdict, and the remedy. Anonymous memory is checked against
//! `MemAvailable` and the cgroup memory limit (the tightest of the process's
//! group and its ancestors, walked by [`super::cgroup`]); huge-page pools are never
//! checked against `MemAvailable` (reserved huge pages are not counted there).

use serde::Serialize;

use crate::error::Error;
pub use hostpool_node::memory::{
    CgroupMemory, cgroup_memory, cgroup_memory_in, meminfo, memory_controller,
};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// There is room.
    Fits,
    /// There is not: building the pool would fail or be killed.
    Short,
    /// The figure could not be read; nothing is known.
    Unknown,
}

/// One capacity check against the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CapacityCheck {
    /// What was checked, e.g. "memory (MemAvailable)".
    pub resource: String,
    /// Where the figure came from.
    pub source: String,
    /// Bytes the pool needs.
    pub need: u64,
    /// Bytes free, when known.
    pub free: Option<u64>,
    /// The verdict.
    pub verdict: Verdict,
    /// What to do when short.
    pub remedy: String,
}

impl CapacityCheck {
    /// A check from a need and a free figure.
    pub fn new(
        resource: &str,
        source: &str,
        need: u64,
        free: Option<u64>,
        remedy: &str,
    ) -> CapacityCheck {
        let verdict = match free {
            Some(f) if need <= f => Verdict::Fits,
            Some(_) => Verdict::Short,
            None => Verdict::Unknown,
        };
        CapacityCheck {
            resource: resource.to_string(),
            source: source.to_string(),
            need,
            free,
            verdict,
            remedy: remedy.to_string(),
        }
    }

    /// The error to fail with when this check is short.
    pub fn to_error(&self) -> Option<Error> {
        match (self.verdict, self.free) {
            (Verdict::Short, Some(free)) => Some(Error::Capacity {
                resource: format!("{} ({})", self.resource, self.source),
                need: self.need,
                free,
                remedy: self.remedy.clone(),
            }),
            _ => None,
        }
    }
}

/// The first short check as an error.
///
/// # Errors
/// [`Error::Capacity`] for the first check whose verdict is short.
pub fn require(checks: &[CapacityCheck]) -> Result<(), Error> {
    match checks.iter().find_map(CapacityCheck::to_error) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Checks for a pool of `need` bytes of ordinary (non-hugetlb) memory.
pub fn ordinary_memory(need: u64) -> Vec<CapacityCheck> {
    let mut checks = vec![CapacityCheck::new(
        "memory",
        "MemAvailable in /proc/meminfo",
        need,
        meminfo("MemAvailable"),
        "free memory on the node or ask for a smaller --size; huge pages reserved for hugetlbfs \
         are not available to this backing (use backing hugetlbfs for them)",
    )];
    if let Some(cg) = cgroup_memory() {
        checks.push(CapacityCheck::new(
            "cgroup memory limit",
            &cg.path.display().to_string(),
            need,
            Some(cg.free),
            "raise the container's memory limit (Kubernetes resources.limits.memory, docker --memory) \
             or ask for a smaller --size",
        ));
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_need_and_free() {
        assert_eq!(
            CapacityCheck::new("m", "s", 10, Some(10), "r").verdict,
            Verdict::Fits
        );
        let short = CapacityCheck::new(
            "memory",
            "MemAvailable",
            11 << 30,
            Some(10 << 30),
            "free some",
        );
        assert_eq!(short.verdict, Verdict::Short);
        let msg = short.to_error().unwrap().to_string();
        assert!(
            msg.contains("11 GiB") && msg.contains("10 GiB") && msg.contains("free some"),
            "{msg}"
        );
        assert_eq!(
            CapacityCheck::new("m", "s", 1, None, "r").verdict,
            Verdict::Unknown
        );
        assert!(require(&[short]).is_err());
    }

    #[test]
    fn an_absurd_pool_is_short_on_this_node() {
        let checks = ordinary_memory(1 << 60);
        assert!(
            checks.iter().any(|c| c.verdict == Verdict::Short),
            "{checks:?}"
        );
        let small = ordinary_memory(4096);
        assert!(
            small.iter().all(|c| c.verdict == Verdict::Fits),
            "{small:?}"
        );
    }
}
