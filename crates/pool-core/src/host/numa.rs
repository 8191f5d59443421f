//! NUMA placement of a pool: which nodes this host has, binding a region to
//! one of them, and checking afterwards where its pages actually landed.
//!
//! The order matters. The first touch of a page decides its node, so a pool
//! is bound ([`bind`], `mbind(MPOL_BIND)` over the whole range) right after it
//! is mapped, *before* prefault and before pinning; only then is it
//! prefaulted, and [`verify`] samples where the pages are.
//!
//! `MPOL_BIND` is strict: when the node runs out of memory the kernel does not
//! fall back to another node, the prefault fails (or the OOM killer acts), so
//! capacity must be checked against the node, not the host.
//!
//! On a host with one node and no NUMA system calls (a kernel without
//! `CONFIG_NUMA`, or a container whose seccomp profile refuses them), binding
//! to that node succeeds with a warning: every page is on it anyway. With more
//! than one node the refusal is an error that says what to do.
//!
//! The system calls themselves are in the private `sys::numa`, which explains
//! why asking the kernel about a page that is not present would fault it in.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::Serialize;

use crate::error::{Context, Error, Result};
use crate::layout::format_bytes;
use crate::sys::Region;
use crate::sys::numa as sys;
pub use hostpool_node::numa::{
    MAX_NODE_ID, ONLINE_NODES_PATH, format_node_list, node_cpus, normalize_pci_address,
    online_nodes, parse_node_list,
};

/// The node [`Placement::elsewhere`] gives for a sampled page that was not in
/// memory: never faulted, or swapped out. [`verify`] does not fault it in.
pub const NOT_PRESENT: i32 = -1;

/// How many misplaced pages [`Placement::require_exact`] lists by offset.
const LISTED: usize = 8;

/// Where a PCI device is: its NUMA node and the CPUs near it, from
/// `/sys/bus/pci/devices/<address>/{numa_node,local_cpulist}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciPlace {
    /// The address as sysfs names it ([`normalize_pci_address`]).
    pub address: String,
    /// Its node; `None` where the kernel says -1 (a host of one node, many
    /// VMs: the firmware gives no affinity).
    pub node: Option<u32>,
    /// The CPUs near it, in the kernel's list format (`"0-31,64-95"`),
    /// when sysfs says.
    pub local_cpus: Option<String>,
}

/// The NUMA node of a PCI device (a GPU, a NIC) and the CPUs near it.
///
/// # Errors
/// [`Error::Config`] for an address that is not one; [`Error::Os`] naming
/// the sysfs file when the device is not there (`ENOENT`: no such device on
/// this host) or its `numa_node` cannot be read or is not a number.
pub fn pci_place(address: &str) -> Result<PciPlace> {
    pci_place_in(&hostpool_node::sysfs_root(), address)
}

fn pci_place_in(root: &Path, address: &str) -> Result<PciPlace> {
    let address = normalize_pci_address(address).map_err(Error::config)?;
    let dir = root.join("bus/pci/devices").join(&address);
    let path = dir.join("numa_node");
    let read_err = |e: io::Error| {
        let remedy = if e.kind() == io::ErrorKind::NotFound {
            format!(
                "this host has no PCI device {address} in sysfs (is /sys mounted, and is the \
                 device the driver reports visible in this container?); give numa_node as a \
                 number instead"
            )
        } else {
            "give numa_node as a number instead".to_string()
        };
        Error::os("read", e, Context::file(&path).remedy(remedy))
    };
    let text = std::fs::read_to_string(&path).map_err(read_err)?;
    let node = match text.trim().parse::<i64>() {
        Ok(n) if n < 0 => None,
        Ok(n) if n <= i64::from(MAX_NODE_ID) => Some(n as u32),
        _ => {
            return Err(read_err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{:?} is not a node number", text.trim()),
            )));
        }
    };
    let local_cpus = std::fs::read_to_string(dir.join("local_cpulist"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    Ok(PciPlace {
        address,
        node,
        local_cpus,
    })
}

/// `Ok` when `node` is online.
///
/// # Errors
/// [`Error::Config`] (exit status 2): "NUMA node 3 does not exist on this host
/// (online nodes: 0); pick one of them or drop numa_node".
pub fn check_node(node: u32) -> Result<()> {
    let online = online_nodes();
    if online.contains(&node) {
        Ok(())
    } else {
        Err(not_online(node, &online))
    }
}

fn not_online(node: u32, online: &[u32]) -> Error {
    let list = if online.is_empty() {
        "none".to_string()
    } else {
        format_node_list(online)
    };
    Error::config(format!(
        "NUMA node {node} does not exist on this host (online nodes: {list}); \
         pick one of them or drop numa_node"
    ))
}

/// Whether a refused NUMA call can be let pass: the host has one node and it
/// is `node`, so every page is on it whatever the policy.
fn moot_on_one_node(e: &io::Error, node: u32) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) && online_nodes() == [node]
}

/// Bind the region's pages to `node`: `mbind(MPOL_BIND)` over the whole mapped
/// range, with `MPOL_MF_STRICT | MPOL_MF_MOVE`, so pages already faulted on
/// another node are moved, or the call fails.
///
/// Call it **before** prefault: the first touch decides placement, and moving
/// pages afterwards costs a copy of each (and fails for pinned ones).
///
/// # Errors
/// [`Error::Config`] as for [`check_node`] when `node` is not online (the
/// kernel's `EINVAL`); [`Error::Os`] for any other refusal, with a remedy:
/// a memoryless node or one outside this process's cpuset (`EINVAL`), pages
/// that could not be moved (`EIO`), a seccomp profile (`EPERM`), no NUMA in
/// the kernel (`ENOSYS`, unless the host has just this one node).
pub fn bind(region: &Region, node: u32) -> Result<()> {
    let e = match sys::bind_region(region, node, sys::MPOL_MF_STRICT | sys::MPOL_MF_MOVE) {
        Ok(()) => {
            tracing::debug!(
                node,
                addr = region.addr() as usize,
                len = region.mapped_len(),
                "bound pool memory to NUMA node"
            );
            return Ok(());
        }
        Err(e) => e,
    };
    let online = online_nodes();
    if !online.contains(&node) {
        return Err(not_online(node, &online));
    }
    if moot_on_one_node(&e, node) {
        tracing::warn!(
            "mbind is not available ({e}); this host has the one NUMA node {node}, \
             so every page is on it anyway"
        );
        return Ok(());
    }
    let remedy = bind_remedy(e.raw_os_error(), node);
    Err(Error::os(
        "mbind(MPOL_BIND, MPOL_MF_STRICT|MPOL_MF_MOVE)",
        e,
        Context::new(region.mapped_len(), region.page())
            .addr(region.addr() as usize)
            .remedy(remedy),
    ))
}

fn bind_remedy(errno: Option<i32>, node: u32) -> String {
    let numactl =
        format!("or drop numa_node and start the process under `numactl --membind={node}`");
    match errno {
        Some(libc::EINVAL) => format!(
            "node {node} is online but the kernel refused it: it may have no memory of its own \
             (see /sys/devices/system/node/has_memory) or this process's cpuset may exclude it \
             (Mems_allowed_list in /proc/self/status); pick a node with memory that the cpuset allows"
        ),
        Some(libc::EIO) => "pages of the range were already present on another node and could \
             not be moved (pinned, or shared with another process); bind right after mapping, \
             before prefault and before pinning"
            .to_string(),
        Some(libc::EFAULT) => {
            "part of the range is not mapped; bind the pool while all of it is mapped".to_string()
        }
        Some(libc::ENOMEM) => format!(
            "the kernel ran out of memory for the policy or for moving pages; free memory on node {node}"
        ),
        Some(libc::EPERM) => format!(
            "the call was refused, typically by a container's seccomp profile (Docker allows mbind \
             only with CAP_SYS_NICE): run with `--cap-add SYS_NICE`, {numactl}"
        ),
        Some(libc::ENOSYS) => format!(
            "this kernel has no NUMA support (CONFIG_NUMA) or a seccomp profile hides the call; \
             {numactl}"
        ),
        _ => format!("drop numa_node, {numactl}"),
    }
}

/// Where the sampled pages of a region are, as [`verify`] found them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The node the pages should be on.
    pub node: u32,
    /// How many pages were sampled.
    pub sampled: usize,
    /// How many of them are on `node`.
    pub on_node: usize,
    /// The others: byte offset in the region and the node that backs it, or
    /// [`NOT_PRESENT`] when no page was in memory there.
    pub elsewhere: Vec<(u64, i32)>,
}

impl Placement {
    /// Whether pages were sampled and every one is on the node.
    pub fn is_exact(&self) -> bool {
        self.sampled > 0 && self.on_node == self.sampled && self.elsewhere.is_empty()
    }

    /// How many sampled pages were not in memory.
    pub fn not_present(&self) -> usize {
        self.elsewhere
            .iter()
            .filter(|(_, n)| *n == NOT_PRESENT)
            .count()
    }

    /// `Ok` when [`is_exact`](Self::is_exact).
    ///
    /// # Errors
    /// [`Error::Plugin`] (exit status 1) saying how many sampled pages are
    /// where, the first few offsets, and what to do.
    pub fn require_exact(&self) -> Result<()> {
        if self.is_exact() {
            return Ok(());
        }
        let node = self.node;
        let what = format!("NUMA placement on node {node}");
        if self.sampled == 0 {
            return Err(Error::Plugin {
                what,
                message: "no page was sampled, so nothing is known about the placement; \
                          sample at least one page"
                    .into(),
                source: None,
            });
        }
        let mut by_node: BTreeMap<i32, usize> = BTreeMap::new();
        for (_, n) in &self.elsewhere {
            *by_node.entry(*n).or_default() += 1;
        }
        let breakdown: Vec<String> = by_node
            .iter()
            .map(|(n, count)| match *n {
                NOT_PRESENT => format!("{count} not in memory"),
                n => format!("{count} on node {n}"),
            })
            .collect();
        let listed: Vec<String> = self
            .elsewhere
            .iter()
            .take(LISTED)
            .map(|(off, n)| {
                let at = format!("offset {off:#x} ({})", format_bytes(*off));
                match *n {
                    NOT_PRESENT => format!("{at}: not in memory"),
                    n => format!("{at}: node {n}"),
                }
            })
            .collect();
        let more = self.elsewhere.len().saturating_sub(LISTED);
        let more = if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        };
        let mut remedies = Vec::new();
        if self.not_present() > 0 {
            remedies.push("prefault the pool before verifying its placement".to_string());
        }
        if self.not_present() < self.elsewhere.len() {
            remedies.push(format!(
                "bind before prefault (the first touch decides the node) and make sure node \
                 {node} has free memory (/sys/devices/system/node/node{node}/meminfo)"
            ));
        }
        Err(Error::Plugin {
            what,
            message: format!(
                "{} of {} sampled pages are not on node {node} ({}): {}{more}; {}",
                self.elsewhere.len(),
                self.sampled,
                breakdown.join(", "),
                listed.join(", "),
                remedies.join("; "),
            ),
            source: None,
        })
    }
}

/// Check placement after prefault: sample up to `samples` pages (of the
/// region's page size) spread evenly over the region, always including the
/// first and the last page, and ask the kernel
/// (`get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`) which node backs each.
///
/// `samples` below 2 is raised to 2 (first and last page); a region with
/// fewer pages has each sampled once, so `sampled` is
/// `min(max(samples, 2), pages)`.
///
/// A page that is not in memory (never faulted, or swapped out) is reported
/// as [`NOT_PRESENT`] and is **not** faulted in: the kernel's query would
/// fault it (mapping the zero page into private memory, allocating a page of
/// shared memory), so residency is checked with `mincore` first. A private
/// page that was only ever read is backed by the zero page and reports the
/// zero page's node; prefault with writes (as the prefault engine does)
/// avoids that.
///
/// # Errors
/// [`Error::Os`] when the query fails (`EFAULT`: the region is not mapped;
/// `ENOSYS`/`EPERM`: no NUMA calls, except on a host whose one node is
/// `node`, where present pages count as on it).
pub fn verify(region: &Region, node: u32, samples: usize) -> Result<Placement> {
    let page = region.page().get();
    let offsets = sample_offsets(region.mapped_len() / page, page, samples);
    let mut placement = Placement {
        node,
        sampled: offsets.len(),
        on_node: 0,
        elsewhere: Vec::new(),
    };
    let base = crate::sys::base_page_size() as u64;
    for off in offsets {
        let found = match sys::page_node(region, off) {
            Ok(Some(n)) => n,
            Ok(None) => NOT_PRESENT,
            // The page is resident (the mincore check passed) and the host has
            // only this node.
            Err(e) if moot_on_one_node(&e, node) => node as i32,
            Err(e) => {
                let remedy = match e.raw_os_error() {
                    Some(libc::EFAULT) => {
                        "the page is not mapped; verify the pool while it is mapped".to_string()
                    }
                    Some(libc::EPERM | libc::ENOSYS) => format!(
                        "the kernel refused the query (a seccomp profile, or no NUMA support); \
                         run with `--cap-add SYS_NICE` in a container, or skip the check and \
                         read /proc/<pid>/numa_maps for node {node}"
                    ),
                    _ => format!("skip the check and read /proc/<pid>/numa_maps for node {node}"),
                };
                let mut context = Context::new(base, region.page()).remedy(remedy);
                if let Some(a) = region.at(off) {
                    context = context.addr(a as usize);
                }
                return Err(Error::os(
                    "get_mempolicy(MPOL_F_NODE|MPOL_F_ADDR)",
                    e,
                    context,
                ));
            }
        };
        if u32::try_from(found) == Ok(node) {
            placement.on_node += 1;
        } else {
            placement.elsewhere.push((off, found));
        }
    }
    Ok(placement)
}

/// Byte offsets of the pages to sample: `min(max(samples, 2), pages)` page
/// indices spread evenly from the first page to the last, distinct and
/// ascending.
fn sample_offsets(pages: u64, page: u64, samples: usize) -> Vec<u64> {
    if pages == 0 {
        return Vec::new();
    }
    let n = (samples.max(2) as u64).min(pages);
    if n == 1 {
        return vec![0];
    }
    // i * (pages-1) / (n-1) grows by at least 1 per step since n <= pages.
    (0..n)
        .map(|i| {
            let index = u128::from(i) * u128::from(pages - 1) / u128::from(n - 1);
            index as u64 * page
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pci_device_is_placed_from_its_sysfs_files() {
        let root = std::env::temp_dir().join(format!("numa-pci-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dev = |addr: &str, node: &str, cpus: Option<&str>| {
            let d = root.join("bus/pci/devices").join(addr);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("numa_node"), node).unwrap();
            if let Some(c) = cpus {
                std::fs::write(d.join("local_cpulist"), c).unwrap();
            }
        };
        dev("0000:3b:00.0", "1\n", Some("16-31\n"));
        dev("0000:bc:00.0", "-1\n", None);
        dev("0000:bd:00.0", "one\n", None);
        let p = pci_place_in(&root, "00000000:3B:00.0").unwrap();
        assert_eq!(
            p,
            PciPlace {
                address: "0000:3b:00.0".into(),
                node: Some(1),
                local_cpus: Some("16-31".into()),
            }
        );
        let p = pci_place_in(&root, "0000:BC:00.0").unwrap();
        assert_eq!((p.node, p.local_cpus), (None, None), "-1 is no node");
        let e = pci_place_in(&root, "0000:bd:00.0").unwrap_err();
        assert!(e.to_string().contains("numa_node"), "{e}");
        let e = pci_place_in(&root, "0000:99:00.0").unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
        assert!(
            e.to_string().contains("no PCI device 0000:99:00.0") && e.exit_code() == 1,
            "{e}"
        );
        assert!(pci_place_in(&root, "nonsense").unwrap_err().is_usage());
        std::fs::remove_dir_all(&root).unwrap();
    }
    use crate::layout::Extent;
    use crate::layout::{PageSize, round_to_page};
    use crate::sys::{AnonMapOptions, Mmap};

    /// An anonymous mapping owned by a test, unmapped on drop.
    struct Mapped {
        mmap: Mmap,
    }

    impl Mapped {
        fn new(len: usize, page: PageSize, shared: bool) -> Mapped {
            let size = round_to_page(len as u64, page).unwrap();
            assert_eq!(size.mapped(), len as u64);
            let mmap = Mmap::anonymous(
                size,
                AnonMapOptions {
                    shared,
                    align: page.get() as usize,
                },
            )
            .unwrap();
            Mapped { mmap }
        }

        fn region(&self) -> Region<'_> {
            self.mmap.region()
        }

        fn len(&self) -> usize {
            self.region().mapped_len() as usize
        }

        fn populate(&self, offset: usize, len: usize) {
            assert!(offset + len <= self.len());
            self.region()
                .populate_write(Extent {
                    offset: offset as u64,
                    len: len as u64,
                })
                .unwrap();
        }

        fn resident(&self) -> u64 {
            self.region().resident_pages().unwrap()
        }
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn check_node_accepts_0_and_refuses_63_as_a_config_error() {
        check_node(0).unwrap();
        let e = check_node(63).unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{e:?}");
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        for want in [
            "NUMA node 63 does not exist on this host",
            "online nodes: 0",
            "drop numa_node",
        ] {
            assert!(msg.contains(want), "missing {want:?} in {msg}");
        }
    }

    #[test]
    fn samples_spread_evenly_and_include_first_and_last_page() {
        let page = 4096;
        let offs = sample_offsets(16384, page, 64);
        assert_eq!(offs.len(), 64);
        assert_eq!(offs[0], 0);
        assert_eq!(*offs.last().unwrap(), 16383 * page);
        assert!(offs.windows(2).all(|w| w[0] < w[1]));
        assert!(offs.iter().all(|o| o % page == 0));
        // Even spread: gaps differ by at most one page.
        let gaps: Vec<u64> = offs.windows(2).map(|w| w[1] - w[0]).collect();
        let (lo, hi) = (gaps.iter().min().unwrap(), gaps.iter().max().unwrap());
        assert!(hi - lo <= page, "{lo} vs {hi}");
        // More samples than pages: every page once.
        assert_eq!(
            sample_offsets(5, page, 100),
            vec![0, 4096, 8192, 12288, 16384]
        );
        assert_eq!(sample_offsets(5, page, 5).len(), 5);
        // Fewer than two samples: first and last anyway.
        assert_eq!(sample_offsets(10, page, 0), vec![0, 9 * page]);
        assert_eq!(sample_offsets(10, page, 1), vec![0, 9 * page]);
        assert_eq!(sample_offsets(1, page, 64), vec![0]);
        assert_eq!(sample_offsets(0, page, 64), Vec::<u64>::new());
        // Huge pools do not overflow.
        let offs = sample_offsets(1 << 40, 1 << 21, 3);
        assert_eq!(
            offs,
            vec![0, ((1u64 << 40) - 1) / 2 * (1 << 21), ((1 << 40) - 1) << 21]
        );
    }

    #[test]
    fn bound_then_prefaulted_memory_is_on_node_0() {
        let m = Mapped::new(64 * MIB, PageSize::BASE_4K, false);
        bind(&m.region(), 0).unwrap();
        m.populate(0, m.len());
        let p = verify(&m.region(), 0, 64).unwrap();
        assert_eq!(p.sampled, 64);
        assert_eq!(p.on_node, 64);
        assert!(p.elsewhere.is_empty());
        assert!(p.is_exact());
        p.require_exact().unwrap();
        // Binding again after prefault: the pages are on the node, nothing moves.
        bind(&m.region(), 0).unwrap();
        // A tiny sample count still checks first and last page.
        assert_eq!(verify(&m.region(), 0, 1).unwrap().sampled, 2);
    }

    #[test]
    fn every_page_of_a_small_region_is_sampled() {
        let m = Mapped::new(8 * 4096, PageSize::BASE_4K, false);
        bind(&m.region(), 0).unwrap();
        m.populate(0, m.len());
        let p = verify(&m.region(), 0, 1000).unwrap();
        assert_eq!((p.sampled, p.on_node), (8, 8));
    }

    #[test]
    fn verify_reports_unfaulted_pages_and_does_not_fault_them() {
        let m = Mapped::new(16 * MIB, PageSize::BASE_4K, false);
        bind(&m.region(), 0).unwrap();
        let p = verify(&m.region(), 0, 16).unwrap();
        assert_eq!((p.sampled, p.on_node), (16, 0));
        assert_eq!(p.not_present(), 16);
        assert_eq!(p.elsewhere[0], (0, NOT_PRESENT));
        assert_eq!(
            *p.elsewhere.last().unwrap(),
            ((16 * MIB - 4096) as u64, NOT_PRESENT)
        );
        assert_eq!(m.resident(), 0, "verify must not fault pages in");
        let e = p.require_exact().unwrap_err();
        assert_eq!(e.exit_code(), 1);
        let msg = e.to_string();
        assert!(
            msg.contains("16 of 16 sampled pages are not on node 0"),
            "{msg}"
        );
        assert!(
            msg.contains("16 not in memory") && msg.contains("prefault"),
            "{msg}"
        );
        assert!(msg.contains("and 8 more"), "{msg}");
    }

    #[test]
    fn verify_on_shared_memory_does_not_allocate() {
        let m = Mapped::new(4 * MIB, PageSize::BASE_4K, true);
        bind(&m.region(), 0).unwrap();
        let p = verify(&m.region(), 0, 8).unwrap();
        assert_eq!(p.not_present(), 8);
        assert_eq!(m.resident(), 0);
        m.populate(0, m.len());
        assert!(verify(&m.region(), 0, 8).unwrap().is_exact());
    }

    #[test]
    fn a_partly_faulted_region_shows_its_holes_at_first_and_last_page() {
        let m = Mapped::new(4 * MIB, PageSize::BASE_4K, false);
        bind(&m.region(), 0).unwrap();
        m.populate(MIB, 2 * MIB);
        let p = verify(&m.region(), 0, 4).unwrap();
        // Samples at pages 0, 341, 682, 1023: the first and last are holes.
        assert_eq!(p.sampled, 4);
        assert_eq!(p.on_node, 2);
        assert_eq!(
            p.elsewhere,
            vec![(0, NOT_PRESENT), ((4 * MIB - 4096) as u64, NOT_PRESENT)]
        );
    }

    #[test]
    fn bind_to_a_missing_node_is_a_config_error() {
        let m = Mapped::new(4 * MIB, PageSize::BASE_4K, false);
        for node in [63, 1000, u32::MAX] {
            let e = bind(&m.region(), node).unwrap_err();
            assert!(matches!(e, Error::Config { .. }), "{e:?}");
            assert_eq!(e.exit_code(), 2);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("NUMA node {node} does not exist"))
                    && msg.contains("online nodes: 0"),
                "{msg}"
            );
        }
        // Nothing was bound or faulted.
        assert_eq!(m.resident(), 0);
        bind(&m.region(), 0).unwrap();
    }

    #[test]
    fn transparent_huge_pages_bind_and_verify() {
        let m = Mapped::new(8 * MIB, PageSize::HUGE_2M, false);
        m.region().advise_hugepage().unwrap();
        bind(&m.region(), 0).unwrap();
        m.populate(0, m.len());
        let p = verify(&m.region(), 0, 64).unwrap();
        assert_eq!((p.sampled, p.on_node), (4, 4), "one sample per 2 MiB page");
        p.require_exact().unwrap();
    }

    #[test]
    fn misplacement_is_explained() {
        let p = Placement {
            node: 1,
            sampled: 20,
            on_node: 8,
            elsewhere: (0..12)
                .map(|i| (i * 4096, if i % 3 == 0 { NOT_PRESENT } else { 0 }))
                .collect(),
        };
        assert!(!p.is_exact());
        assert_eq!(p.not_present(), 4);
        let e = p.require_exact().unwrap_err();
        assert!(matches!(e, Error::Plugin { .. }));
        assert_eq!(e.exit_code(), 1);
        let msg = e.to_string();
        for want in [
            "NUMA placement on node 1",
            "12 of 20 sampled pages are not on node 1",
            "4 not in memory",
            "8 on node 0",
            "offset 0x1000 (4 KiB): node 0",
            "offset 0x0 (0 B): not in memory",
            "and 4 more",
            "bind before prefault",
            "node1/meminfo",
            "prefault the pool",
        ] {
            assert!(msg.contains(want), "missing {want:?} in {msg}");
        }
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["elsewhere"][0], serde_json::json!([0, -1]));
        assert_eq!(json["on_node"], 8);

        let empty = Placement {
            node: 0,
            sampled: 0,
            on_node: 0,
            elsewhere: vec![],
        };
        assert!(!empty.is_exact());
        assert!(empty.require_exact().is_err());
    }

    #[test]
    fn remedies_name_the_cause() {
        assert!(bind_remedy(Some(libc::EPERM), 1).contains("SYS_NICE"));
        assert!(bind_remedy(Some(libc::EIO), 1).contains("before prefault"));
        assert!(bind_remedy(Some(libc::EINVAL), 1).contains("has_memory"));
        assert!(bind_remedy(Some(libc::ENOSYS), 2).contains("numactl --membind=2"));
    }
}
