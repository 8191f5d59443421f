//! Memory on this node: `/proc/meminfo`, and the cgroup memory limit that
//! binds this process (the tightest of its group and its ancestors, walked
//! by [`crate::cgroup`]), with what is still usable under it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::cgroup::{self, CgroupLimit, Controller, LimitFile};

/// A field of `/proc/meminfo` in bytes.
pub fn meminfo(field: &str) -> Option<u64> {
    parse_meminfo(&fs::read_to_string("/proc/meminfo").ok()?, field)
}

fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    crate::process::kb_field(text, field)
}

/// The memory limit that binds this process's cgroup and the bytes still
/// usable under it (limit − usage + page cache, which the kernel can
/// reclaim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The limit file read: in the process's own group or in the ancestor
    /// that sets the tightest limit.
    pub path: PathBuf,
    /// The limit in bytes.
    pub limit: u64,
    /// Bytes usable under it.
    pub free: u64,
}

/// What the memory controller's limits are read from: v2 `memory.max` and
/// `memory.current`, v1 `memory.limit_in_bytes` and `memory.usage_in_bytes`.
pub fn memory_controller() -> Controller {
    Controller {
        name: "memory".into(),
        v2: vec![LimitFile::new("memory.max", "memory.current")],
        v1: vec![LimitFile::new(
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
        )],
    }
}

/// The memory limit that binds this process, if a finite one does: of the
/// finite limits of its group and every ancestor ([`cgroup::limits`]), the
/// one with the least usable room.
pub fn cgroup_memory() -> Option<CgroupMemory> {
    tightest_memory(cgroup::limits(&memory_controller()))
}

/// [`cgroup_memory`] for the process whose `/proc/PID/cgroup` text is `own`,
/// with its hierarchies under `root`.
pub fn cgroup_memory_in(own: &str, root: &Path) -> Option<CgroupMemory> {
    tightest_memory(cgroup::limits_in(own, root, &memory_controller()))
}

/// The limit with the least usable room; of equals, the first (deepest).
fn tightest_memory(limits: Vec<CgroupLimit>) -> Option<CgroupMemory> {
    limits
        .into_iter()
        .map(|l| usable(&l))
        .min_by_key(|m| m.free)
}

/// What a memory limit leaves usable, with the page cache its group's
/// `memory.stat` says the kernel can reclaim.
fn usable(l: &CgroupLimit) -> CgroupMemory {
    let stat = fs::read_to_string(l.group().join("memory.stat")).unwrap_or_default();
    // v2 names the page cache `file`, v1 `total_cache` (hierarchical).
    let (cache_key, shmem_key) = if l.file_name() == "memory.max" {
        ("file", "shmem")
    } else {
        ("total_cache", "total_shmem")
    };
    let field = |key: &str| -> u64 {
        stat.lines()
            .find_map(|line| {
                let (k, v) = line.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
            .unwrap_or(0)
    };
    // Page cache can be reclaimed, except tmpfs/shmem pages (without swap),
    // which is exactly what a shared-memory pool is made of.
    let reclaimable = field(cache_key).saturating_sub(field(shmem_key));
    CgroupMemory {
        path: l.path.clone(),
        limit: l.limit,
        free: l.free().saturating_add(reclaimable).min(l.limit),
    }
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

    /// A nested group under a parent with the tighter limit, in v2 and v1:
    /// the parent's limit binds, with the page cache of the parent's
    /// `memory.stat` counted as usable.
    #[test]
    fn cgroup_memory_takes_the_parents_tighter_limit() {
        const M: u64 = 1 << 20;
        let root =
            std::env::temp_dir().join(format!("hostpool-capacity-cg-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let write = |rel: &str, text: String| {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        };
        for (own, group, parent, limit, usage, stat) in [
            (
                "0::/kubepods/pod1\n",
                "kubepods/pod1",
                "kubepods",
                "memory.max",
                "memory.current",
                "file 6291456\nshmem 2097152\n",
            ),
            (
                "9:memory:/docker/abc\n0::/\n",
                "memory/docker/abc",
                "memory/docker",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_cache 6291456\ntotal_shmem 2097152\n",
            ),
        ] {
            // Own: 1 GiB, 100 MiB used. Parent: 256 MiB, 250 MiB used, 4 MiB
            // of it reclaimable cache (6 MiB of cache, 2 MiB of it shmem).
            write(&format!("{group}/{limit}"), format!("{}\n", 1024 * M));
            write(&format!("{group}/{usage}"), format!("{}\n", 100 * M));
            write(&format!("{parent}/{limit}"), format!("{}\n", 256 * M));
            write(&format!("{parent}/{usage}"), format!("{}\n", 250 * M));
            write(&format!("{parent}/memory.stat"), stat.to_string());
            let cg = cgroup_memory_in(own, &root).unwrap();
            assert_eq!(cg.path, root.join(parent).join(limit), "{own}");
            assert_eq!((cg.limit, cg.free), (256 * M, 10 * M), "{own}");
            // The own group tighter: it binds.
            write(&format!("{group}/{usage}"), format!("{}\n", 1020 * M));
            let cg = cgroup_memory_in(own, &root).unwrap();
            assert_eq!(cg.path, root.join(group).join(limit), "{own}");
            assert_eq!(cg.free, 4 * M);
        }
        assert_eq!(cgroup_memory_in("0::/none\n", &root.join("nothing")), None);
        fs::remove_dir_all(&root).unwrap();
    }
}
