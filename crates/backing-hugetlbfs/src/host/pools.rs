//! The huge page pools as sysfs reports them: per page size
//! (`/sys/kernel/mm/hugepages`) and per NUMA node
//! (`/sys/devices/system/node`), and the default huge page size.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use pool_core::format_bytes;
use pool_core::host::capacity;
use pool_core::{Error, Result};

use super::KIB;

/// Where the kernel lists its huge page sizes.
const HUGEPAGES_ROOT: &str = "/sys/kernel/mm/hugepages";
/// Where the kernel lists NUMA nodes.
const NODES_ROOT: &str = "/sys/devices/system/node";

/// One huge page pool as the kernel reports it (counts in pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HugePagePool {
    /// The page size in bytes.
    pub page_size: u64,
    /// `nr_hugepages`: pages in the pool, surplus pages included.
    pub total: u64,
    /// `free_hugepages`: pages not faulted in by anyone, reserved ones included.
    pub free: u64,
    /// `resv_hugepages`: free pages promised to existing mappings.
    pub resv: u64,
    /// `surplus_hugepages`: pages allocated above the persistent pool through
    /// overcommit.
    pub surplus: u64,
    /// `nr_overcommit_hugepages`: how many surplus pages the kernel may allocate.
    pub overcommit: u64,
}

impl HugePagePool {
    /// Pages a new mapping can still get: free − resv + (overcommit − surplus),
    /// saturating (DPDK's formula).
    ///
    /// The overcommit part is a ceiling, not a promise: surplus pages are
    /// allocated from free memory when needed and may not be obtainable.
    pub fn available(&self) -> u64 {
        self.free
            .saturating_sub(self.resv)
            .saturating_add(self.overcommit.saturating_sub(self.surplus))
    }

    /// [`HugePagePool::available`] in bytes (saturating).
    pub fn available_bytes(&self) -> u64 {
        self.available().saturating_mul(self.page_size)
    }

    /// The persistent pool, `total − surplus`: what writing `nr_hugepages`
    /// sets (the kernel converts surplus pages first).
    pub fn persistent(&self) -> u64 {
        self.total.saturating_sub(self.surplus)
    }
}

/// The sysfs directory of a page size: `/sys/kernel/mm/hugepages/hugepages-<kB>kB`.
pub fn sysfs_dir(page_size: u64) -> PathBuf {
    Path::new(HUGEPAGES_ROOT).join(size_dir_name(page_size))
}

/// Page sizes this kernel supports (from `/sys/kernel/mm/hugepages`), ascending.
/// Empty when the directory is missing (no `CONFIG_HUGETLBFS`, or no `/sys`).
pub fn supported_sizes() -> Vec<u64> {
    Sysfs::real().sizes()
}

/// The system-wide pool of a page size.
///
/// # Errors
/// [`Error::NotAvailable`] when the kernel has no such size (the message
/// lists the supported sizes), when it has no huge pages at all, or when a
/// counter cannot be read or parsed (the message names the file).
pub fn pool(page_size: u64) -> Result<HugePagePool> {
    Sysfs::real().pool(page_size).map_err(PoolError::into_error)
}

/// The pool of one NUMA node, from
/// `/sys/devices/system/node/node<N>/hugepages/hugepages-<kB>kB`
/// (`nr_hugepages`, `free_hugepages`, `surplus_hugepages`).
///
/// The kernel keeps reservations and the overcommit limit system-wide only,
/// so `resv` and `overcommit` are reported as 0 here: `available()` of a
/// node pool is its free pages, some of which may be promised to mappings
/// elsewhere (see [`pool`] for those).
///
/// # Errors
/// [`Error::NotAvailable`] when the node does not exist (the message lists the
/// nodes), when the node has no such page size, or when a counter cannot be
/// read.
pub fn node_pool(node: u32, page_size: u64) -> Result<HugePagePool> {
    Sysfs::real()
        .node_pool(node, page_size)
        .map_err(PoolError::into_error)
}

/// The default huge page size (`Hugepagesize` in `/proc/meminfo`), in bytes.
pub fn default_size() -> Option<u64> {
    capacity::meminfo("Hugepagesize").filter(|&s| s > 0)
}

/// The sysfs roots the readers use: the real ones, or a fake tree in tests.
#[derive(Debug, Clone)]
pub(super) struct Sysfs {
    /// `/sys/kernel/mm/hugepages`.
    pub(super) hugepages: PathBuf,
    /// `/sys/devices/system/node`.
    pub(super) nodes: PathBuf,
}

/// Why a pool could not be read.
#[derive(Debug)]
pub(super) enum PoolError {
    /// The hugepages directory itself is missing.
    NoHugepages {
        /// The missing directory.
        root: PathBuf,
    },
    /// The kernel (or node) has no such page size.
    NoSize {
        /// The size asked for.
        page_size: u64,
        /// The directory that is missing.
        dir: PathBuf,
        /// The sizes that exist there.
        supported: Vec<u64>,
    },
    /// The NUMA node does not exist.
    NoNode {
        /// The node asked for.
        node: u32,
        /// The directory that is missing.
        dir: PathBuf,
        /// The nodes that exist.
        nodes: Vec<u32>,
    },
    /// A counter could not be read or parsed.
    Read {
        /// The counter file.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
}

impl PoolError {
    /// One line for an operator.
    pub(super) fn describe(&self) -> String {
        match self {
            PoolError::NoHugepages { root } => format!(
                "{} does not exist: the kernel was built without CONFIG_HUGETLBFS or /sys is not \
                 mounted",
                root.display()
            ),
            PoolError::NoSize {
                page_size,
                dir,
                supported,
            } => format!(
                "there are no {} huge pages here ({} does not exist); supported sizes: {}",
                format_bytes(*page_size),
                dir.display(),
                size_list(supported)
            ),
            PoolError::NoNode { node, dir, nodes } => format!(
                "NUMA node {node} does not exist ({} is missing); nodes on this host: {}",
                dir.display(),
                if nodes.is_empty() {
                    "none listed (kernel without CONFIG_NUMA?)".to_string()
                } else {
                    nodes
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            PoolError::Read { path, source } => {
                format!("cannot read {}: {source}", path.display())
            }
        }
    }

    /// The public error.
    fn into_error(self) -> Error {
        let what = match &self {
            PoolError::NoHugepages { .. } => "huge pages".to_string(),
            PoolError::NoSize { page_size, .. } => {
                format!("{} huge pages", format_bytes(*page_size))
            }
            PoolError::NoNode { node, .. } => format!("NUMA node {node}"),
            PoolError::Read { .. } => "the huge page counters".to_string(),
        };
        Error::NotAvailable {
            what,
            reason: self.describe(),
        }
    }
}

impl Sysfs {
    /// The real sysfs.
    pub(super) fn real() -> Sysfs {
        Sysfs {
            hugepages: PathBuf::from(HUGEPAGES_ROOT),
            nodes: PathBuf::from(NODES_ROOT),
        }
    }

    /// The system directory of a page size.
    pub(super) fn size_dir(&self, page_size: u64) -> PathBuf {
        self.hugepages.join(size_dir_name(page_size))
    }

    /// A node's directory.
    fn node_dir(&self, node: u32) -> PathBuf {
        self.nodes.join(format!("node{node}"))
    }

    /// A node's directory of a page size.
    pub(super) fn node_size_dir(&self, node: u32, page_size: u64) -> PathBuf {
        self.node_dir(node)
            .join("hugepages")
            .join(size_dir_name(page_size))
    }

    /// Supported sizes, ascending.
    fn sizes(&self) -> Vec<u64> {
        sizes_in(&self.hugepages)
    }

    /// The system pool.
    pub(super) fn pool(&self, page_size: u64) -> Result<HugePagePool, PoolError> {
        if !self.hugepages.is_dir() {
            return Err(PoolError::NoHugepages {
                root: self.hugepages.clone(),
            });
        }
        let dir = self.size_dir(page_size);
        if !is_size(page_size) || !dir.is_dir() {
            return Err(PoolError::NoSize {
                page_size,
                dir,
                supported: self.sizes(),
            });
        }
        Ok(HugePagePool {
            page_size,
            total: read_counter(&dir.join("nr_hugepages"))?,
            free: read_counter(&dir.join("free_hugepages"))?,
            resv: read_counter(&dir.join("resv_hugepages"))?,
            surplus: read_counter(&dir.join("surplus_hugepages"))?,
            overcommit: read_counter(&dir.join("nr_overcommit_hugepages"))?,
        })
    }

    /// The pool of one node (resv and overcommit 0).
    pub(super) fn node_pool(&self, node: u32, page_size: u64) -> Result<HugePagePool, PoolError> {
        let node_dir = self.node_dir(node);
        if !node_dir.is_dir() {
            return Err(PoolError::NoNode {
                node,
                dir: node_dir,
                nodes: nodes_in(&self.nodes),
            });
        }
        let dir = self.node_size_dir(node, page_size);
        if !is_size(page_size) || !dir.is_dir() {
            return Err(PoolError::NoSize {
                page_size,
                dir,
                supported: sizes_in(&node_dir.join("hugepages")),
            });
        }
        Ok(HugePagePool {
            page_size,
            total: read_counter(&dir.join("nr_hugepages"))?,
            free: read_counter(&dir.join("free_hugepages"))?,
            resv: 0,
            surplus: read_counter(&dir.join("surplus_hugepages"))?,
            overcommit: 0,
        })
    }
}

/// `hugepages-<kB>kB`.
fn size_dir_name(page_size: u64) -> String {
    format!("hugepages-{}kB", page_size / KIB)
}

/// Whether a size can name a sysfs directory at all (whole, non-zero kB).
fn is_size(page_size: u64) -> bool {
    page_size > 0 && page_size.is_multiple_of(KIB)
}

/// The page size a `hugepages-<kB>kB` directory name stands for.
fn parse_size_dir(name: &str) -> Option<u64> {
    let kb: u64 = name
        .strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse()
        .ok()?;
    kb.checked_mul(KIB).filter(|&b| b > 0)
}

/// The sizes listed in a `hugepages` directory, ascending.
fn sizes_in(dir: &Path) -> Vec<u64> {
    let mut sizes: Vec<u64> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| parse_size_dir(e.ok()?.file_name().to_str()?))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The nodes listed in `/sys/devices/system/node`, ascending.
fn nodes_in(dir: &Path) -> Vec<u32> {
    let mut nodes: Vec<u32> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("node")?
                .parse()
                .ok()
        })
        .collect();
    nodes.sort_unstable();
    nodes
}

/// "2 MiB, 1 GiB", or a note that there are none.
fn size_list(sizes: &[u64]) -> String {
    if sizes.is_empty() {
        "none".to_string()
    } else {
        sizes
            .iter()
            .map(|&s| format_bytes(s))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One sysfs counter.
fn read_counter(path: &Path) -> Result<u64, PoolError> {
    let text = fs::read_to_string(path).map_err(|source| PoolError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.trim().parse().map_err(|_| PoolError::Read {
        path: path.to_path_buf(),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a page count: {:?}", text.trim()),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup_limit;
    use crate::host::testing::{G1, M2, TempTree};

    fn pool_of(free: u64, resv: u64, surplus: u64, overcommit: u64) -> HugePagePool {
        HugePagePool {
            page_size: M2,
            total: free,
            free,
            resv,
            surplus,
            overcommit,
        }
    }

    #[test]
    fn available_is_dpdks_formula_and_saturates() {
        assert_eq!(pool_of(10, 3, 0, 0).available(), 7);
        assert_eq!(pool_of(10, 3, 2, 5).available(), 10);
        // More reserved than free (never seen, but no wrap) and more surplus
        // than overcommit (after the overcommit limit was lowered).
        assert_eq!(pool_of(2, 5, 0, 0).available(), 0);
        assert_eq!(pool_of(4, 0, 9, 3).available(), 4);
        assert_eq!(pool_of(u64::MAX, 0, 0, u64::MAX).available(), u64::MAX);
        assert_eq!(pool_of(3, 1, 0, 0).available_bytes(), 2 * M2);
        let p = HugePagePool {
            total: 10,
            surplus: 4,
            ..pool_of(0, 0, 0, 0)
        };
        assert_eq!(p.persistent(), 6);
    }

    #[test]
    fn names_of_page_sizes() {
        assert_eq!(
            sysfs_dir(M2),
            Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB")
        );
        assert_eq!(
            sysfs_dir(G1),
            Path::new("/sys/kernel/mm/hugepages/hugepages-1048576kB")
        );
        assert_eq!(parse_size_dir("hugepages-2048kB"), Some(M2));
        assert_eq!(parse_size_dir("hugepages-kB"), None);
        assert_eq!(parse_size_dir("hugepages-2048"), None);
        assert_eq!(parse_size_dir("hugepages-0kB"), None);
    }

    #[test]
    fn fake_sysfs_pools_are_read_and_sizes_sorted() {
        let t = TempTree::new("pools");
        t.pool(1_048_576, [2, 1, 0, 0, 0]);
        t.pool(2048, [100, 40, 10, 3, 8]);
        t.write("kernel/mm/hugepages/not-a-size", "");
        let sys = t.sysfs();
        assert_eq!(sys.sizes(), vec![M2, G1]);
        let p = sys.pool(M2).unwrap();
        assert_eq!(
            p,
            HugePagePool {
                page_size: M2,
                total: 100,
                free: 40,
                resv: 10,
                surplus: 3,
                overcommit: 8
            }
        );
        assert_eq!(p.available(), 35);
        // 2 MiB + 1 byte must not round down onto the 2048 kB directory.
        for bad in [3 << 20, M2 + 1, 0] {
            let msg = sys.pool(bad).unwrap_err().into_error().to_string();
            assert!(msg.contains("supported sizes: 2 MiB, 1 GiB"), "{msg}");
        }
        // A counter that is garbage or unreadable is an error naming the file.
        t.write("kernel/mm/hugepages/hugepages-2048kB/resv_hugepages", "x\n");
        let e = sys.pool(M2).unwrap_err().into_error();
        assert!(e.is_not_available());
        assert!(e.to_string().contains("resv_hugepages"), "{e}");
        fs::remove_file(t.0.join("kernel/mm/hugepages/hugepages-2048kB/resv_hugepages")).unwrap();
        fs::create_dir(t.0.join("kernel/mm/hugepages/hugepages-2048kB/resv_hugepages")).unwrap();
        assert!(matches!(sys.pool(M2), Err(PoolError::Read { .. })));
        // No hugepages directory at all.
        let none = Sysfs {
            hugepages: t.0.join("missing"),
            nodes: t.0.join("missing"),
        };
        assert!(matches!(none.pool(M2), Err(PoolError::NoHugepages { .. })));
        assert!(none.sizes().is_empty());
    }

    #[test]
    fn fake_node_pools_report_no_resv_or_overcommit() {
        let t = TempTree::new("nodes");
        t.pool(2048, [8, 8, 0, 0, 0]);
        t.node(0, 2048, [6, 5, 1]);
        t.node(1, 2048, [2, 2, 0]);
        let sys = t.sysfs();
        let p = sys.node_pool(0, M2).unwrap();
        assert_eq!(
            (p.total, p.free, p.surplus, p.resv, p.overcommit),
            (6, 5, 1, 0, 0)
        );
        assert_eq!(p.available(), 5);
        let msg = sys.node_pool(7, M2).unwrap_err().into_error().to_string();
        assert!(
            msg.contains("NUMA node 7") && msg.contains("nodes on this host: 0, 1"),
            "{msg}"
        );
        let msg = sys.node_pool(1, G1).unwrap_err().into_error().to_string();
        assert!(msg.contains("supported sizes: 2 MiB"), "{msg}");
    }

    #[test]
    fn this_machine_has_2mib_pages() {
        let sizes = supported_sizes();
        assert!(sizes.contains(&M2), "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{sizes:?}");
        let default = default_size().unwrap();
        assert!(sizes.contains(&default), "{default} not in {sizes:?}");
        let p = pool(M2).unwrap();
        assert_eq!(p.page_size, M2);
        assert!(p.free <= p.total && p.surplus <= p.total, "{p:?}");
        let e = pool(3 << 20).unwrap_err();
        let msg = e.to_string();
        assert!(e.is_not_available(), "{msg}");
        assert!(
            msg.contains("3 MiB huge pages") && msg.contains("2 MiB"),
            "{msg}"
        );
        let n = node_pool(0, M2).unwrap();
        assert_eq!((n.resv, n.overcommit, n.page_size), (0, 0, M2));
        assert!(n.free <= n.total && n.total <= p.total, "{n:?} {p:?}");
        let e = node_pool(99, M2).unwrap_err();
        assert!(
            e.is_not_available() && e.to_string().contains("node 99"),
            "{e}"
        );
        // Whatever the hugetlb cgroup holds, reading it does not fail.
        eprintln!("hugetlb cgroup limit here: {:?}", cgroup_limit(M2));
    }
}
