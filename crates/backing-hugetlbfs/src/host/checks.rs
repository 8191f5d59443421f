//! The capacity checks of a hugetlb pool, built from the system and node
//! pools, the mount's `size=` and the hugetlb cgroup limit, each with the
//! exact remedy.

use std::fmt::Write as _;
use std::path::Path;

use pool_core::format_bytes;
use pool_core::host::capacity::CapacityCheck;

use super::cgroup::{HugetlbCgroup, cgroup_limit, cgroup_size_name};
use super::kubernetes::{k8s_quantity, k8s_size_name};
use super::mount::{MountLimit, MountProbe, probe_mount};
use super::pools::{HugePagePool, PoolError, Sysfs};
use super::{GIB, KIB, MIB};

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

/// `ceil(bytes / page)`; a zero page counts bytes.
fn pages(bytes: u64, page: u64) -> u64 {
    bytes.div_ceil(page.max(1))
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
pub(super) fn cgroup_check(need: u64, page_size: u64, cg: &HugetlbCgroup) -> CapacityCheck {
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
    use crate::host::mount_limit;
    use crate::host::pool;
    use crate::host::testing::{G1, M2, TempTree};
    use pool_core::host::capacity::Verdict;
    use std::fs;
    use std::path::PathBuf;

    #[test]
    fn names_of_page_sizes() {
        assert_eq!(kernel_size_name(G1), "1G");
        assert_eq!(kernel_size_name(M2), "2M");
        assert_eq!(kernel_size_name(3 << 29), "1536M");
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
        // The conformance suite beside this test takes pages from the same
        // pool: counting while it runs sees its pages come and go.
        let _serial = crate::tests::HUGE_PAGES
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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
            assert!(
                std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() != Ok("1"),
                "HOSTPOOL_REQUIRE_HUGEPAGES=1 but two 2 MiB pages are not free: {before:?}"
            );
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
