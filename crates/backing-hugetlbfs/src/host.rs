//! Huge page pools, hugetlbfs and hugetlb cgroup limits, and the capacity
//! checks built from them: what this backing reads of the host.
//!
//! A hugetlb pool can fail in four places, and each has its own counter:
//!
//! - the system pool (`/sys/kernel/mm/hugepages/hugepages-<kB>kB`): a
//!   `MAP_SHARED` mapping reserves its pages at `mmap` time and fails with
//!   `ENOMEM` when too few are available;
//! - the pool of one NUMA node (`/sys/devices/system/node/node<N>/hugepages`),
//!   when the pool is bound to that node;
//! - the `size=` limit of the hugetlbfs mount (`statfs`), also `ENOMEM` at
//!   `mmap`;
//! - the hugetlb cgroup: `hugetlb.<size>.rsvd.max` is enforced at `mmap`,
//!   `hugetlb.<size>.max` only when a page is faulted in, as `SIGBUS` (even
//!   with `MAP_POPULATE`), which is why it is checked up front.
//!
//! Huge page pools are never checked against `MemAvailable`: reserved huge
//! pages are not counted there (SGLang rejected valid pools for this).
//!
//! Nothing here panics on a missing or malformed sysfs file: the public
//! readers return an error or `None`, and a capacity check whose figure
//! cannot be read has no `free` figure (verdict
//! [`Unknown`](pool_core::host::capacity::Verdict::Unknown)).
//!
//! Only the creator of a shared pool should run these checks: once it has
//! reserved its pages, the counts look too low to the ranks that join it.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use pool_core::format_bytes;
use pool_core::host::capacity::{self, CapacityCheck};
use pool_core::host::cgroup::{self, CgroupLimit, Controller, LimitFile};
use pool_core::host::fs::{self as hostfs, FsInfo, HUGETLBFS_MAGIC, TMPFS_MAGIC};
use pool_core::{Error, Result};

/// Where the kernel lists its huge page sizes.
const HUGEPAGES_ROOT: &str = "/sys/kernel/mm/hugepages";
/// Where the kernel lists NUMA nodes.
const NODES_ROOT: &str = "/sys/devices/system/node";
/// One kibibyte.
const KIB: u64 = 1 << 10;
/// One mebibyte.
const MIB: u64 = 1 << 20;
/// One gibibyte.
const GIB: u64 = 1 << 30;

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

/// The `size=` limit of a hugetlbfs mount, from `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MountLimit {
    /// The limit in pages (`f_blocks`).
    pub total_pages: u64,
    /// Pages still usable under it (`f_bfree`): the limit minus the pages
    /// files on the mount hold or have reserved.
    pub free_pages: u64,
    /// The mount's page size in bytes (`f_bsize`).
    pub page_size: u64,
}

impl MountLimit {
    /// The limit in bytes (saturating).
    pub fn total_bytes(&self) -> u64 {
        self.total_pages.saturating_mul(self.page_size)
    }

    /// The free pages in bytes (saturating).
    pub fn free_bytes(&self) -> u64 {
        self.free_pages.saturating_mul(self.page_size)
    }
}

/// The hugetlb cgroup limit that binds this process for one page size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HugetlbCgroup {
    /// The limit file read, e.g. `/sys/fs/cgroup/pod/hugetlb.2MB.max` or
    /// `.../hugetlb.2MB.rsvd.max`.
    pub path: PathBuf,
    /// The limit in bytes.
    pub limit: u64,
    /// Bytes charged against it now.
    pub usage: u64,
}

impl From<CgroupLimit> for HugetlbCgroup {
    fn from(l: CgroupLimit) -> HugetlbCgroup {
        HugetlbCgroup {
            path: l.path,
            limit: l.limit,
            usage: l.usage,
        }
    }
}

impl HugetlbCgroup {
    /// Bytes still allowed: `limit − usage`, saturating.
    pub fn free(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }

    /// Whether this is a reservation limit (`.rsvd.`, enforced at `mmap`) rather
    /// than a fault limit (enforced as `SIGBUS` when a page is touched).
    pub fn is_reservation_limit(&self) -> bool {
        self.path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains(".rsvd."))
    }

    /// The cgroup directory holding the limit file.
    pub fn group(&self) -> &Path {
        self.path.parent().unwrap_or(&self.path)
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

/// A hugetlbfs mount's `size=` limit in pages (`statfs` `f_blocks`, `f_bfree`).
///
/// `Ok(None)` when the mount has no limit: `f_blocks` is 0 without `size=`
/// (and all ones with only `min_size=`). `dir` may be any directory inside
/// the mount. A limit cannot be raised with `mount -o remount`: hugetlbfs
/// has no remount handler, so a new `size=` needs a fresh mount.
///
/// # Errors
/// [`Error::Config`] when `dir` does not exist or is not on hugetlbfs (for example `/dev/shm`, which is
/// tmpfs): a size limit in pages only means something on hugetlbfs.
pub fn mount_limit(dir: &Path) -> Result<Option<MountLimit>> {
    let st = hostfs::statfs_info(dir).map_err(|e| {
        Error::on_input_path(
            "statfs",
            dir,
            e,
            format!("cannot examine {}", dir.display()),
            "give an existing directory on a hugetlbfs mount (`mount -t hugetlbfs -o pagesize=2M \
             none DIR`)",
        )
    })?;
    limit_from_statfs(dir, &st)
}

/// This process's hugetlb cgroup limit for the page size, if a finite one
/// binds it.
///
/// The group and its ancestors are walked by [`pool_core::host::cgroup`],
/// like the memory limit of [`capacity::cgroup_memory`]; the files read are
/// those of [`hugetlb_controller`]: in cgroup v2 `hugetlb.<size>.max` and
/// `.current`, and `hugetlb.<size>.rsvd.max` and `.rsvd.current` when
/// present; in cgroup v1 (`/sys/fs/cgroup/hugetlb`)
/// `hugetlb.<size>.limit_in_bytes` and `usage_in_bytes`, and the `rsvd.`
/// variants, where `<size>` is the cgroup name of the page size
/// ([`cgroup_size_name`]).
///
/// Of all finite limits found (fault and reservation, own group and
/// ancestors), the one with the least room left (`limit − usage`) is
/// returned. A limit whose usage file cannot be read is skipped.
pub fn cgroup_limit(page_size: u64) -> Option<HugetlbCgroup> {
    cgroup::tightest(&hugetlb_controller(page_size)).map(HugetlbCgroup::from)
}

/// The hugetlb controller's files for a page size, for the cgroup walk.
pub fn hugetlb_controller(page_size: u64) -> Controller {
    let name = cgroup_size_name(page_size);
    let pair = |limit: &str, usage: &str| {
        LimitFile::new(
            format!("hugetlb.{name}.{limit}"),
            format!("hugetlb.{name}.{usage}"),
        )
    };
    Controller {
        name: "hugetlb".into(),
        v2: vec![pair("max", "current"), pair("rsvd.max", "rsvd.current")],
        v1: vec![
            pair("limit_in_bytes", "usage_in_bytes"),
            pair("rsvd.limit_in_bytes", "rsvd.usage_in_bytes"),
        ],
    }
}

/// The name cgroups use for a page size in their file names: `"2MB"`,
/// `"1GB"`, `"64KB"` (the kernel's `mem_fmt`: the largest of GB, MB, KB not
/// larger than the size, truncated).
pub fn cgroup_size_name(page_size: u64) -> String {
    if page_size >= GIB {
        format!("{}GB", page_size / GIB)
    } else if page_size >= MIB {
        format!("{}MB", page_size / MIB)
    } else {
        format!("{}KB", page_size / KIB)
    }
}

/// The name Kubernetes uses for a page size in `hugepages-<name>` resources
/// and `HugePages-<name>` emptyDir media: `"2Mi"`, `"1Gi"`, `"64Ki"` (a
/// canonical binary quantity).
pub fn k8s_size_name(page_size: u64) -> String {
    k8s_quantity(page_size)
}

/// Capacity checks for a hugetlb pool of `need` bytes (already a multiple of
/// `page_size`).
///
/// In order: the system pool (its available pages, see
/// [`HugePagePool::available`]); the node pool when `node` is given; the
/// mount's `size=` limit when `dir` is a hugetlbfs mount with one; the
/// hugetlb cgroup limit when a finite one applies ([`cgroup_limit`]). Never
/// `MemAvailable`, which does not count reserved huge pages.
///
/// A page size the kernel lacks, or a node that does not exist, is short
/// with 0 bytes free. A counter that cannot be read, or a `dir` that cannot
/// be examined, gives a check with no `free` figure (verdict unknown). A
/// `dir` that is not on hugetlbfs adds no check.
pub fn capacity_checks(
    need: u64,
    page_size: u64,
    dir: Option<&Path>,
    node: Option<u32>,
) -> Vec<CapacityCheck> {
    let mount = dir.map(|d| (d, probe_mount(d)));
    capacity_checks_with(
        &Sysfs::real(),
        need,
        page_size,
        mount,
        node,
        cgroup_limit(page_size),
    )
}

// ---------------------------------------------------------------------------
// sysfs

/// The sysfs roots the readers use: the real ones, or a fake tree in tests.
#[derive(Debug, Clone)]
struct Sysfs {
    /// `/sys/kernel/mm/hugepages`.
    hugepages: PathBuf,
    /// `/sys/devices/system/node`.
    nodes: PathBuf,
}

/// Why a pool could not be read.
#[derive(Debug)]
enum PoolError {
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
    fn describe(&self) -> String {
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
    fn real() -> Sysfs {
        Sysfs {
            hugepages: PathBuf::from(HUGEPAGES_ROOT),
            nodes: PathBuf::from(NODES_ROOT),
        }
    }

    /// The system directory of a page size.
    fn size_dir(&self, page_size: u64) -> PathBuf {
        self.hugepages.join(size_dir_name(page_size))
    }

    /// A node's directory.
    fn node_dir(&self, node: u32) -> PathBuf {
        self.nodes.join(format!("node{node}"))
    }

    /// A node's directory of a page size.
    fn node_size_dir(&self, node: u32, page_size: u64) -> PathBuf {
        self.node_dir(node)
            .join("hugepages")
            .join(size_dir_name(page_size))
    }

    /// Supported sizes, ascending.
    fn sizes(&self) -> Vec<u64> {
        sizes_in(&self.hugepages)
    }

    /// The system pool.
    fn pool(&self, page_size: u64) -> Result<HugePagePool, PoolError> {
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
    fn node_pool(&self, node: u32, page_size: u64) -> Result<HugePagePool, PoolError> {
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

// ---------------------------------------------------------------------------
// hugetlbfs mounts

/// What `statfs` says about a `dir` given to [`capacity_checks`].
#[derive(Debug)]
enum MountProbe {
    /// Not hugetlbfs: no check.
    Other,
    /// hugetlbfs with a limit, or without one (`None`).
    Hugetlbfs(Option<MountLimit>),
    /// `statfs` failed.
    Unreadable(String),
}

/// `statfs(dir)` for the capacity checks.
fn probe_mount(dir: &Path) -> MountProbe {
    match hostfs::statfs_info(dir) {
        Err(e) => MountProbe::Unreadable(e.to_string()),
        Ok(st) => match limit_from_statfs(dir, &st) {
            Ok(limit) => MountProbe::Hugetlbfs(limit),
            Err(_) => MountProbe::Other,
        },
    }
}

/// The limit a `statfs` result describes.
fn limit_from_statfs(dir: &Path, st: &FsInfo) -> Result<Option<MountLimit>> {
    let (magic, blocks) = (st.magic, st.blocks);
    if magic != HUGETLBFS_MAGIC {
        let kind = if magic == TMPFS_MAGIC {
            "tmpfs".to_string()
        } else {
            format!("filesystem magic {magic:#x}")
        };
        return Err(Error::config(format!(
            "{} is not on hugetlbfs (it is {kind}); a size= limit in huge pages exists only on a \
             hugetlbfs mount (`mount -t hugetlbfs -o pagesize=2M none DIR`)",
            dir.display()
        )));
    }
    // No size=: 0. Only min_size=: the kernel stores -1 as the maximum.
    if blocks == 0 || blocks > i64::MAX as u64 {
        return Ok(None);
    }
    Ok(Some(MountLimit {
        total_pages: blocks,
        free_pages: st.blocks_free.min(blocks),
        page_size: st.block_size,
    }))
}

// ---------------------------------------------------------------------------
// checks

/// `ceil(bytes / page)`; a zero page counts bytes.
fn pages(bytes: u64, page: u64) -> u64 {
    bytes.div_ceil(page.max(1))
}

/// A canonical Kubernetes binary quantity: `4Gi`, `2Mi`, or plain bytes.
fn k8s_quantity(bytes: u64) -> String {
    for (shift, suffix) in [
        (60, "Ei"),
        (50, "Pi"),
        (40, "Ti"),
        (30, "Gi"),
        (20, "Mi"),
        (10, "Ki"),
    ] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A size for the kernel command line and mount options: `1G`, `2M`, `64K`.
fn kernel_size_name(bytes: u64) -> String {
    if bytes != 0 && bytes.is_multiple_of(GIB) {
        format!("{}G", bytes / GIB)
    } else if bytes != 0 && bytes.is_multiple_of(MIB) {
        format!("{}M", bytes / MIB)
    } else {
        format!("{}K", bytes.div_ceil(KIB))
    }
}

/// The checks, over injectable sources.
fn capacity_checks_with(
    sys: &Sysfs,
    need: u64,
    page_size: u64,
    mount: Option<(&Path, MountProbe)>,
    node: Option<u32>,
    cgroup: Option<HugetlbCgroup>,
) -> Vec<CapacityCheck> {
    let mut checks = vec![pool_check(
        need,
        page_size,
        sys.pool(page_size),
        &sys.size_dir(page_size),
        None,
    )];
    if let Some(n) = node {
        checks.push(pool_check(
            need,
            page_size,
            sys.node_pool(n, page_size),
            &sys.node_size_dir(n, page_size),
            Some(n),
        ));
    }
    match mount {
        Some((dir, MountProbe::Hugetlbfs(Some(limit)))) => {
            checks.push(mount_check(need, dir, limit));
        }
        Some((dir, MountProbe::Unreadable(e))) => checks.push(CapacityCheck::new(
            "hugetlbfs size= limit",
            &dir.display().to_string(),
            need,
            None,
            &format!(
                "cannot statfs {}: {e}; the pool directory must exist on a hugetlbfs mount",
                dir.display()
            ),
        )),
        _ => {}
    }
    if let Some(cg) = cgroup {
        checks.push(cgroup_check(need, page_size, &cg));
    }
    checks
}

/// The check of the system pool (`node` None) or of one node's pool.
fn pool_check(
    need: u64,
    page_size: u64,
    pool: Result<HugePagePool, PoolError>,
    dir: &Path,
    node: Option<u32>,
) -> CapacityCheck {
    let size = format_bytes(page_size);
    let resource = match node {
        None => format!("{size} huge page pool"),
        Some(n) => format!("{size} huge page pool of NUMA node {n}"),
    };
    let source = dir.display().to_string();
    match pool {
        Ok(p) => {
            let remedy = pool_remedy(need, &p, dir, node);
            CapacityCheck::new(&resource, &source, need, Some(p.available_bytes()), &remedy)
        }
        Err(e @ (PoolError::NoSize { .. } | PoolError::NoNode { .. })) => {
            let fix = match e {
                PoolError::NoNode { .. } => "bind the pool to one of those nodes",
                _ => {
                    "use one of the supported sizes, or enable this one at boot \
                     (hugepagesz=SIZE) if the CPU supports it"
                }
            };
            let remedy = format!("{}; {fix}", e.describe());
            CapacityCheck::new(&resource, &source, need, Some(0), &remedy)
        }
        Err(e) => {
            let remedy = format!(
                "{}; the free huge page count is unknown: make /sys readable (in a container, \
                 do not mask /sys/kernel/mm/hugepages)",
                e.describe()
            );
            CapacityCheck::new(&resource, &source, need, None, &remedy)
        }
    }
}

/// The remedy of a pool check, with the page counts and the exact command.
fn pool_remedy(need: u64, p: &HugePagePool, dir: &Path, node: Option<u32>) -> String {
    let size = format_bytes(p.page_size);
    let need_pages = pages(need, p.page_size);
    let avail = p.available();
    let shortfall = need_pages.saturating_sub(avail);
    let target = p.persistent().saturating_add(shortfall);
    let mut s = format!(
        "{need_pages} pages of {size} needed, {avail} available (free {}",
        p.free
    );
    match node {
        None => {
            let _ = write!(s, ", reserved {}", p.resv);
            if p.overcommit > 0 || p.surplus > 0 {
                let _ = write!(s, ", surplus {} of overcommit {}", p.surplus, p.overcommit);
            }
        }
        Some(_) => {
            let _ = write!(
                s,
                ", surplus {}; reservations are counted system-wide, not per node",
                p.surplus
            );
        }
    }
    s.push(')');
    if shortfall == 0 {
        s.push_str("; nothing to do");
        return s;
    }
    let _ = write!(
        s,
        "; reserve more: `echo {target} > {}`",
        dir.join("nr_hugepages").display()
    );
    if p.page_size >= GIB {
        let boot = match node {
            None => format!(
                "hugepagesz={} hugepages={target}",
                kernel_size_name(p.page_size)
            ),
            Some(n) => format!(
                "hugepagesz={} hugepages={n}:{target}",
                kernel_size_name(p.page_size)
            ),
        };
        let _ = write!(
            s,
            " ({size} pages are best reserved at boot, before memory fragments: {boot})"
        );
    } else {
        s.push_str(" and read it back: the kernel gives fewer pages when memory is fragmented");
    }
    if node.is_none() {
        let k8s = k8s_size_name(p.page_size);
        let _ = write!(
            s,
            "; on Kubernetes request resources.limits.hugepages-{k8s}: {} and mount an emptyDir \
             with medium: HugePages-{k8s}",
            k8s_quantity(need_pages.saturating_mul(p.page_size))
        );
    }
    s
}

/// The check of a hugetlbfs mount's `size=` limit.
fn mount_check(need: u64, dir: &Path, l: MountLimit) -> CapacityCheck {
    let need_pages = pages(need, l.page_size);
    let used = l.total_pages.saturating_sub(l.free_pages);
    let wanted = used.saturating_add(need_pages).saturating_mul(l.page_size);
    let remedy = format!(
        "the hugetlbfs mount {dir} has size={limit} ({total} pages, {free} free) and the pool \
         needs {need_pages} pages; mount it again with a larger size= (at least {wanted}) or none: \
         `umount {dir} && mount -t hugetlbfs -o pagesize={page},size={wanted} none {dir}` \
         (`mount -o remount` does not change a hugetlbfs size=; unmounting drops its files)",
        dir = dir.display(),
        limit = format_bytes(l.total_bytes()),
        total = l.total_pages,
        free = l.free_pages,
        page = kernel_size_name(l.page_size),
        wanted = kernel_size_name(wanted),
    );
    CapacityCheck::new(
        "hugetlbfs size= limit",
        &dir.display().to_string(),
        need,
        Some(l.free_bytes()),
        &remedy,
    )
}

/// The check of a hugetlb cgroup limit.
fn cgroup_check(need: u64, page_size: u64, cg: &HugetlbCgroup) -> CapacityCheck {
    let name = cgroup_size_name(page_size);
    let (what, when) = if cg.is_reservation_limit() {
        (
            "reservation limit",
            "it is enforced at mmap, which fails with ENOMEM",
        )
    } else {
        (
            "limit",
            "it is enforced when pages are touched, as SIGBUS even with MAP_POPULATE, which is \
             why it is checked before mapping",
        )
    };
    let remedy = format!(
        "the hugetlb cgroup {group} allows {limit} of {size} pages ({usage} in use), {free} pages \
         left, the pool needs {need_pages}; raise {file} (hugetlb.{name}.max and \
         hugetlb.{name}.rsvd.max) or the pod's resources.limits.hugepages-{k8s}; {when}",
        group = cg.group().display(),
        limit = format_bytes(cg.limit),
        size = format_bytes(page_size),
        usage = format_bytes(cg.usage),
        free = cg.free() / page_size.max(1),
        need_pages = pages(need, page_size),
        file = cg.path.display(),
        k8s = k8s_size_name(page_size),
    );
    CapacityCheck::new(
        &format!("hugetlb cgroup {what} ({name})"),
        &cg.path.display().to_string(),
        need,
        Some(cg.free()),
        &remedy,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool_core::host::capacity::Verdict;

    const M2: u64 = 2 << 20;
    const G1: u64 = 1 << 30;

    /// [`cgroup_limit`] for the process whose `/proc/PID/cgroup` text is
    /// `own`, with its hierarchies under `root`.
    fn cgroup_limit_in(own: &str, root: &Path, page_size: u64) -> Option<HugetlbCgroup> {
        cgroup::tightest_in(own, root, &hugetlb_controller(page_size)).map(HugetlbCgroup::from)
    }

    /// A directory under the temp dir, removed on drop.
    struct TempTree(PathBuf);

    impl TempTree {
        fn new(name: &str) -> TempTree {
            let dir = std::env::temp_dir().join(format!(
                "hostpool-hugetlb-test-{}-{name}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempTree(dir)
        }

        fn write(&self, rel: &str, text: &str) {
            let path = self.0.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }

        fn sysfs(&self) -> Sysfs {
            Sysfs {
                hugepages: self.0.join("kernel/mm/hugepages"),
                nodes: self.0.join("devices/system/node"),
            }
        }

        /// A system pool: total, free, resv, surplus, overcommit.
        fn pool(&self, kb: u64, c: [u64; 5]) {
            let d = format!("kernel/mm/hugepages/hugepages-{kb}kB");
            for (f, v) in [
                "nr_hugepages",
                "free_hugepages",
                "resv_hugepages",
                "surplus_hugepages",
                "nr_overcommit_hugepages",
            ]
            .iter()
            .zip(c)
            {
                self.write(&format!("{d}/{f}"), &format!("{v}\n"));
            }
        }

        /// A node pool: total, free, surplus.
        fn node(&self, node: u32, kb: u64, c: [u64; 3]) {
            let d = format!("devices/system/node/node{node}/hugepages/hugepages-{kb}kB");
            for (f, v) in ["nr_hugepages", "free_hugepages", "surplus_hugepages"]
                .iter()
                .zip(c)
            {
                self.write(&format!("{d}/{f}"), &format!("{v}\n"));
            }
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

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
        assert_eq!(cgroup_size_name(M2), "2MB");
        assert_eq!(cgroup_size_name(G1), "1GB");
        assert_eq!(cgroup_size_name(64 << 10), "64KB");
        assert_eq!(cgroup_size_name(32 << 20), "32MB");
        assert_eq!(cgroup_size_name(16 << 30), "16GB");
        assert_eq!(k8s_size_name(M2), "2Mi");
        assert_eq!(k8s_size_name(G1), "1Gi");
        assert_eq!(k8s_size_name(64 << 10), "64Ki");
        assert_eq!(k8s_quantity(384 << 30), "384Gi");
        assert_eq!(k8s_quantity(3 << 29), "1536Mi");
        assert_eq!(k8s_quantity(1 << 40), "1Ti");
        assert_eq!(k8s_quantity(1000), "1000");
        assert_eq!(k8s_quantity(0), "0");
        assert_eq!(kernel_size_name(G1), "1G");
        assert_eq!(kernel_size_name(M2), "2M");
        assert_eq!(kernel_size_name(3 << 29), "1536M");
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
    fn short_system_pool_names_the_sysfs_file_and_page_counts() {
        let t = TempTree::new("short");
        // 100 pages, 3 of them surplus; 40 free, 10 of those reserved.
        t.pool(2048, [100, 40, 10, 3, 8]);
        let sys = t.sysfs();
        let checks = capacity_checks_with(&sys, 50 * M2, M2, None, None, None);
        assert_eq!(checks.len(), 1);
        let c = &checks[0];
        assert_eq!(c.verdict, Verdict::Short);
        assert_eq!(c.free, Some(35 * M2));
        let nr =
            t.0.join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages");
        // Shortfall 15 on a persistent pool of 97.
        let echo = format!("`echo 112 > {}`", nr.display());
        for want in [
            "50 pages of 2 MiB needed",
            "35 available",
            "free 40",
            "reserved 10",
            echo.as_str(),
            "hugepages-2Mi: 100Mi",
            "medium: HugePages-2Mi",
        ] {
            assert!(c.remedy.contains(want), "missing {want:?} in {}", c.remedy);
        }
        let err = c.to_error().unwrap().to_string();
        assert!(err.contains("hugepages-2048kB"), "{err}");
        // The same pool fits 35 pages.
        let fits = capacity_checks_with(&sys, 35 * M2, M2, None, None, None);
        assert_eq!(fits[0].verdict, Verdict::Fits);
    }

    #[test]
    fn one_gib_pools_suggest_boot_reservation() {
        let t = TempTree::new("gib");
        t.pool(1_048_576, [2, 2, 0, 0, 0]);
        t.node(0, 1_048_576, [2, 1, 0]);
        let sys = t.sysfs();
        let checks = capacity_checks_with(&sys, 4 * G1, G1, None, Some(0), None);
        assert_eq!(checks.len(), 2);
        assert!(
            checks.iter().all(|c| c.verdict == Verdict::Short),
            "{checks:?}"
        );
        assert!(
            checks[0].remedy.contains("hugepagesz=1G hugepages=4")
                && checks[0].remedy.contains("hugepages-1Gi: 4Gi"),
            "{}",
            checks[0].remedy
        );
        let node_nr =
            t.0.join("devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages");
        let r = &checks[1].remedy;
        assert!(
            r.contains(&format!("`echo 5 > {}`", node_nr.display())),
            "{r}"
        );
        assert!(
            r.contains("hugepages=0:5") && r.contains("4 pages of 1 GiB"),
            "{r}"
        );
        assert!(r.contains("not per node"), "{r}");
        assert_eq!(checks[1].free, Some(G1));
    }

    #[test]
    fn missing_sizes_and_nodes_are_short_and_unreadable_counters_unknown() {
        let t = TempTree::new("missing");
        t.pool(2048, [4, 4, 0, 0, 0]);
        t.node(0, 2048, [4, 4, 0]);
        let sys = t.sysfs();
        let checks = capacity_checks_with(&sys, G1, G1, None, Some(3), None);
        assert_eq!(checks[0].verdict, Verdict::Short);
        assert_eq!(checks[0].free, Some(0));
        assert!(
            checks[0].remedy.contains("supported sizes: 2 MiB"),
            "{}",
            checks[0].remedy
        );
        assert_eq!(checks[1].verdict, Verdict::Short);
        assert!(
            checks[1].remedy.contains("nodes on this host: 0"),
            "{}",
            checks[1].remedy
        );
        t.write("kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "");
        let unknown = capacity_checks_with(&sys, M2, M2, None, None, None);
        assert_eq!(unknown[0].verdict, Verdict::Unknown);
        assert!(
            unknown[0].remedy.contains("free_hugepages"),
            "{}",
            unknown[0].remedy
        );
        let gone = Sysfs {
            hugepages: t.0.join("none"),
            nodes: t.0.join("none"),
        };
        let c = capacity_checks_with(&gone, M2, M2, None, None, None);
        assert_eq!(c[0].verdict, Verdict::Unknown);
    }

    #[test]
    fn mount_and_cgroup_checks_are_added_with_their_remedies() {
        let t = TempTree::new("mountcg");
        t.pool(2048, [1000, 1000, 0, 0, 0]);
        let sys = t.sysfs();
        let limit = MountLimit {
            total_pages: 512,
            free_pages: 500,
            page_size: M2,
        };
        let dir = Path::new("/mnt/huge");
        let cg = HugetlbCgroup {
            path: PathBuf::from("/sys/fs/cgroup/pod/hugetlb.2MB.max"),
            limit: 256 * M2,
            usage: 6 * M2,
        };
        let checks = capacity_checks_with(
            &sys,
            600 * M2,
            M2,
            Some((dir, MountProbe::Hugetlbfs(Some(limit)))),
            None,
            Some(cg),
        );
        assert_eq!(checks.len(), 3);
        assert_eq!(checks[0].verdict, Verdict::Fits);
        let m = &checks[1];
        assert_eq!((m.verdict, m.free), (Verdict::Short, Some(500 * M2)));
        assert!(
            m.remedy
                .contains("/mnt/huge has size=1 GiB (512 pages, 500 free)")
                && m.remedy.contains("size=1224M"),
            "{}",
            m.remedy
        );
        let c = &checks[2];
        assert_eq!((c.verdict, c.free), (Verdict::Short, Some(250 * M2)));
        for want in [
            "/sys/fs/cgroup/pod allows 512 MiB",
            "12 MiB in use",
            "hugetlb.2MB.max",
            "hugepages-2Mi",
            "SIGBUS",
        ] {
            assert!(c.remedy.contains(want), "missing {want:?} in {}", c.remedy);
        }
        // No size= limit, not hugetlbfs: no check; statfs failure: unknown.
        for probe in [MountProbe::Hugetlbfs(None), MountProbe::Other] {
            let checks = capacity_checks_with(&sys, M2, M2, Some((dir, probe)), None, None);
            assert_eq!(checks.len(), 1);
        }
        let checks = capacity_checks_with(
            &sys,
            M2,
            M2,
            Some((dir, MountProbe::Unreadable("ENOENT".into()))),
            None,
            None,
        );
        assert_eq!(checks[1].verdict, Verdict::Unknown);
    }

    #[test]
    fn statfs_figures_become_mount_limits() {
        let d = Path::new("/x");
        let limit_from_statfs = |dir: &Path, magic, block_size, blocks, blocks_free| {
            let st = FsInfo {
                magic,
                block_size,
                blocks,
                blocks_free,
            };
            limit_from_statfs(dir, &st)
        };
        assert_eq!(
            limit_from_statfs(d, HUGETLBFS_MAGIC, M2, 0, 0).unwrap(),
            None
        );
        assert_eq!(
            limit_from_statfs(d, HUGETLBFS_MAGIC, M2, u64::MAX, u64::MAX).unwrap(),
            None
        );
        let l = limit_from_statfs(d, HUGETLBFS_MAGIC, M2, 16, 10)
            .unwrap()
            .unwrap();
        assert_eq!(
            (l.total_pages, l.free_pages, l.total_bytes(), l.free_bytes()),
            (16, 10, 32 << 20, 20 << 20)
        );
        let e = limit_from_statfs(d, TMPFS_MAGIC, 4096, 16, 10).unwrap_err();
        assert!(e.is_usage() && e.to_string().contains("tmpfs"), "{e}");
    }

    #[test]
    fn mount_limit_refuses_tmpfs_and_missing_dirs() {
        let e = mount_limit(Path::new("/dev/shm")).unwrap_err();
        let msg = e.to_string();
        assert!(
            e.is_usage() && msg.contains("/dev/shm is not on hugetlbfs (it is tmpfs)"),
            "{msg}"
        );
        let e = mount_limit(Path::new("/nonexistent/hugetlb")).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot examine /nonexistent/hugetlb"),
            "{e}"
        );
        assert!(matches!(
            probe_mount(Path::new("/dev/shm")),
            MountProbe::Other
        ));
        assert!(matches!(
            probe_mount(Path::new("/nonexistent/hugetlb")),
            MountProbe::Unreadable(_)
        ));
    }

    #[test]
    fn cgroup_v2_limits_take_the_tightest_of_group_ancestors_and_rsvd() {
        let t = TempTree::new("cgv2");
        let root = &t.0;
        t.write("kubepods/hugetlb.2MB.max", &format!("{}\n", 100 * M2));
        t.write("kubepods/hugetlb.2MB.current", &format!("{}\n", 10 * M2));
        t.write("kubepods/pod1/hugetlb.2MB.max", "max\n");
        t.write("kubepods/pod1/hugetlb.2MB.current", "0\n");
        t.write(
            "kubepods/pod1/hugetlb.2MB.rsvd.max",
            &format!("{}\n", 95 * M2),
        );
        t.write(
            "kubepods/pod1/hugetlb.2MB.rsvd.current",
            &format!("{}\n", 4 * M2),
        );
        t.write("kubepods/pod1/hugetlb.1GB.max", "max\n");
        t.write("kubepods/pod1/hugetlb.1GB.current", "0\n");
        let own = "0::/kubepods/pod1\n";
        let cg = cgroup_limit_in(own, root, M2).unwrap();
        // Parent: 90 pages left; own rsvd: 91 left.
        assert_eq!(cg.path, root.join("kubepods/hugetlb.2MB.max"));
        assert_eq!(
            (cg.limit, cg.usage, cg.free()),
            (100 * M2, 10 * M2, 90 * M2)
        );
        assert!(!cg.is_reservation_limit());
        assert_eq!(cg.group(), root.join("kubepods"));
        t.write(
            "kubepods/pod1/hugetlb.2MB.rsvd.current",
            &format!("{}\n", 80 * M2),
        );
        let cg = cgroup_limit_in(own, root, M2).unwrap();
        assert!(cg.is_reservation_limit(), "{cg:?}");
        assert_eq!(cg.free(), 15 * M2);
        assert_eq!(cgroup_limit_in(own, root, G1), None);
        // Not visible from here (other namespace, `..`): only the mount root.
        assert_eq!(cgroup_limit_in("0::/elsewhere\n", root, M2), None);
        assert_eq!(cgroup_limit_in("0::/../kubepods\n", root, M2), None);
        t.write("hugetlb.2MB.max", &format!("{}\n", 8 * M2));
        t.write("hugetlb.2MB.current", "0\n");
        let cg = cgroup_limit_in("0::/../x\n", root, M2).unwrap();
        assert_eq!(cg.limit, 8 * M2);
        // A limit without a readable usage is skipped.
        fs::remove_file(root.join("hugetlb.2MB.current")).unwrap();
        assert_eq!(cgroup_limit_in("0::/\n", root, M2), None);
    }

    #[test]
    fn cgroup_v1_and_unified_hierarchies_are_found() {
        let t = TempTree::new("cgv1");
        let root = &t.0;
        t.write(
            "hugetlb/docker/abc/hugetlb.1GB.limit_in_bytes",
            &format!("{}\n", 4 * G1),
        );
        t.write(
            "hugetlb/docker/abc/hugetlb.1GB.usage_in_bytes",
            &format!("{}\n", G1),
        );
        // v1 writes PAGE_COUNTER_MAX for "unlimited".
        t.write(
            "hugetlb/docker/hugetlb.1GB.limit_in_bytes",
            "9223372036854771712\n",
        );
        t.write("hugetlb/docker/hugetlb.1GB.usage_in_bytes", "0\n");
        let own = "12:hugetlb:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        let cg = cgroup_limit_in(own, root, G1).unwrap();
        assert_eq!(
            cg.path,
            root.join("hugetlb/docker/abc/hugetlb.1GB.limit_in_bytes")
        );
        assert_eq!(cg.free(), 3 * G1);
        assert_eq!(cgroup_limit_in("4:memory:/docker/abc\n", root, G1), None);
        let t2 = TempTree::new("cgunified");
        t2.write("unified/svc/hugetlb.2MB.max", &format!("{}\n", 2 * M2));
        t2.write("unified/svc/hugetlb.2MB.current", "0\n");
        let cg = cgroup_limit_in("0::/svc\n", &t2.0, M2).unwrap();
        assert_eq!(cg.limit, 2 * M2);
    }

    #[test]
    fn cgroup_v1_nested_groups_take_the_parents_tighter_limit() {
        let t = TempTree::new("cgv1nested");
        let root = &t.0;
        // Own group: 8 GiB, 1 used; parent: 3 GiB, 1 used, rsvd 2 GiB, 1
        // used (the parent's reservation limit binds).
        for (file, value) in [
            ("kubepods/pod1/ctr/hugetlb.1GB.limit_in_bytes", 8 * G1),
            ("kubepods/pod1/ctr/hugetlb.1GB.usage_in_bytes", G1),
            ("kubepods/pod1/hugetlb.1GB.limit_in_bytes", 3 * G1),
            ("kubepods/pod1/hugetlb.1GB.usage_in_bytes", G1),
            ("kubepods/pod1/hugetlb.1GB.rsvd.limit_in_bytes", 2 * G1),
            ("kubepods/pod1/hugetlb.1GB.rsvd.usage_in_bytes", G1),
        ] {
            t.write(&format!("hugetlb/{file}"), &format!("{value}\n"));
        }
        let own = "5:hugetlb:/kubepods/pod1/ctr\n0::/\n";
        let cg = cgroup_limit_in(own, root, G1).unwrap();
        assert_eq!(
            cg.path,
            root.join("hugetlb/kubepods/pod1/hugetlb.1GB.rsvd.limit_in_bytes")
        );
        assert!(cg.is_reservation_limit());
        assert_eq!(cg.group(), root.join("hugetlb/kubepods/pod1"));
        assert_eq!(cg.free(), G1);
        let c = cgroup_check(G1, G1, &cg);
        assert!(
            c.remedy
                .contains(&format!("{} allows 2 GiB", cg.group().display())),
            "{}",
            c.remedy
        );
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

    #[test]
    fn real_capacity_checks_are_short_beyond_the_pool() {
        let p = pool(M2).unwrap();
        let too_many = p.total.saturating_add(p.overcommit).saturating_add(1);
        let checks = capacity_checks(too_many * M2, M2, None, Some(0));
        assert!(checks.len() >= 2, "{checks:?}");
        for c in &checks[..2] {
            assert_eq!(c.verdict, Verdict::Short, "{c:?}");
            assert!(
                c.remedy
                    .contains(&format!("{too_many} pages of 2 MiB needed")),
                "{}",
                c.remedy
            );
        }
        assert!(
            checks[0]
                .remedy
                .contains("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        );
        assert!(
            checks[1]
                .remedy
                .contains("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")
        );
        // A tmpfs dir is not a hugetlbfs mount: no mount check.
        let with_shm = capacity_checks(M2, M2, Some(Path::new("/dev/shm")), None);
        assert!(
            with_shm
                .iter()
                .all(|c| c.resource != "hugetlbfs size= limit")
        );
    }

    /// The hugetlbfs mount and page count `cargo xtask test` sets up, or
    /// `None` (with a note) when they are missing and not required.
    fn test_hugetlbfs_2m() -> Option<(PathBuf, u64)> {
        let dir = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M").map(PathBuf::from);
        let pages = std::env::var("HOSTPOOL_TEST_HUGEPAGES_2M")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        let required = std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() == Ok("1");
        match (dir, pages) {
            (Some(dir), Some(pages)) => Some((dir, pages)),
            _ if required => panic!(
                "HOSTPOOL_REQUIRE_HUGEPAGES=1 but HOSTPOOL_TEST_HUGETLBFS_2M / \
                 HOSTPOOL_TEST_HUGEPAGES_2M are missing or invalid"
            ),
            _ => {
                eprintln!(
                    "skipping: no HOSTPOOL_TEST_HUGETLBFS_2M/HOSTPOOL_TEST_HUGEPAGES_2M \
                     (run `cargo xtask test` to reserve 2 MiB pages)"
                );
                None
            }
        }
    }

    #[test]
    fn real_hugetlbfs_pages_are_counted() {
        let Some((dir, pages_reserved)) = test_hugetlbfs_2m() else {
            return;
        };
        assert_eq!(
            mount_limit(&dir).unwrap(),
            None,
            "xtask mounts without size="
        );
        assert!(matches!(
            pool_core::host::fs::filesystem_kind(&dir),
            Ok(pool_core::host::fs::FsKind::Hugetlbfs { page_size: M2 })
        ));
        let before = pool(M2).unwrap();
        assert!(
            before.total >= pages_reserved,
            "{before:?} vs {pages_reserved}"
        );
        // A mount without size= adds no check; the system pool is short for
        // more than it could ever hold.
        let beyond = before
            .total
            .saturating_add(before.overcommit)
            .saturating_add(1);
        let checks = capacity_checks(beyond * M2, M2, Some(&dir), None);
        assert!(checks.iter().all(|c| c.resource != "hugetlbfs size= limit"));
        assert_eq!(checks[0].verdict, Verdict::Short, "{checks:?}");
        if pages_reserved < 2 || before.available() < 2 {
            eprintln!("skipping the fallocate part: {before:?}");
            return;
        }
        // fallocate takes pages from the pool: available() drops by exactly that.
        let path = dir.join(format!("hostpool-hugetlb-test-{}", std::process::id()));
        let file = fs::File::create_new(&path).unwrap();
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, 2 * M2).unwrap();
        let during = pool(M2).unwrap();
        fs::remove_file(&path).unwrap();
        drop(file);
        let after = pool(M2).unwrap();
        assert_eq!(
            during.available() + 2,
            before.available(),
            "{before:?} {during:?}"
        );
        assert_eq!(during.free + 2, before.free, "{before:?} {during:?}");
        assert_eq!(after.available(), before.available(), "{after:?}");
        let fits = capacity_checks(before.available() * M2, M2, Some(&dir), Some(0));
        assert_eq!(fits[0].verdict, Verdict::Fits, "{fits:?}");
    }
}
