//! Capacity checks: can the node hold the pool, before anything is mapped.
//!
//! Each check says what it read, how much the pool needs, how much is free,
//! its verdict, and the remedy. Anonymous memory is checked against
//! `MemAvailable` and the cgroup memory limit; huge-page pools are never
//! checked against `MemAvailable` (reserved huge pages are not counted there).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Error;

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

/// A field of `/proc/meminfo` in bytes.
pub fn meminfo(field: &str) -> Option<u64> {
    parse_meminfo(&fs::read_to_string("/proc/meminfo").ok()?, field)
}

fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let mut it = rest.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        match it.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            _ => None,
        }
    })
}

/// The memory limit of this process's cgroup and the bytes still usable
/// under it (limit − usage + page cache, which the kernel can reclaim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The limit file read.
    pub path: PathBuf,
    /// The limit in bytes.
    pub limit: u64,
    /// Bytes usable under it.
    pub free: u64,
}

/// A cgroup limit file in `dir` with a finite limit, and its usage file:
/// `(limit path, limit, usage)`. `None` for "max", for v1's
/// `PAGE_COUNTER_MAX`, and for unreadable files.
pub fn finite_limit(dir: &Path, limit: &str, usage: &str) -> Option<(PathBuf, u64, u64)> {
    let path = dir.join(limit);
    // "max" does not parse: unlimited.
    let limit: u64 = fs::read_to_string(&path).ok()?.trim().parse().ok()?;
    if limit >= UNLIMITED {
        return None;
    }
    let usage: u64 = fs::read_to_string(dir.join(usage))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((path, limit, usage))
}

/// Limits at or above this are "unlimited" (cgroup v1 writes `PAGE_COUNTER_MAX`).
const UNLIMITED: u64 = 1 << 62;

/// The memory limit of this process's cgroup (v2 `memory.max`, or v1
/// `memory.limit_in_bytes`), if it has a finite one.
pub fn cgroup_memory() -> Option<CgroupMemory> {
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                let dir = Path::new(root).join(rel);
                if let Some(m) = read_limit(&dir, "memory.max", "memory.current", ("file", "shmem"))
                {
                    return Some(m);
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            for dir in [
                Path::new("/sys/fs/cgroup/memory").join(rel),
                PathBuf::from("/sys/fs/cgroup/memory"),
            ] {
                if let Some(m) = read_limit(
                    &dir,
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                    ("total_cache", "total_shmem"),
                ) {
                    return Some(m);
                }
            }
        }
    }
    None
}

fn read_limit(
    dir: &Path,
    limit: &str,
    usage: &str,
    (cache_key, shmem_key): (&str, &str),
) -> Option<CgroupMemory> {
    let (path, limit, usage) = finite_limit(dir, limit, usage)?;
    let stat = fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let field = |key: &str| -> u64 {
        stat.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
            .unwrap_or(0)
    };
    // Page cache can be reclaimed, except tmpfs/shmem pages (without swap),
    // which is exactly what a shared-memory pool is made of.
    let reclaimable = field(cache_key).saturating_sub(field(shmem_key));
    Some(CgroupMemory {
        path,
        limit,
        free: limit
            .saturating_sub(usage)
            .saturating_add(reclaimable)
            .min(limit),
    })
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
    fn meminfo_parses_kb_fields() {
        let text =
            "MemTotal:       24684096 kB\nMemAvailable:   20000000 kB\nHugePages_Total:       4\n";
        assert_eq!(parse_meminfo(text, "MemAvailable"), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo(text, "HugePages_Total"), Some(4));
        assert_eq!(parse_meminfo(text, "MemFree"), None);
        assert_eq!(parse_meminfo(text, "MemAvail"), None);
        assert!(meminfo("MemTotal").unwrap() > 0);
    }

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
