//! The capacity checks of a pool of tmpfs files: the file system's size
//! limit (or the node's memory, for a tmpfs without one) and the memory
//! cgroup, which tmpfs pages are charged to.

use std::io;
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;

use pool_core::format_bytes;
use pool_core::host::capacity::{self, CapacityCheck, CgroupMemory};
use pool_core::host::fs::{FsKind, Space, filesystem_kind};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Capacity checks for `need` bytes of tmpfs files in `dir`.
///
/// - the free space of the file system (`statvfs`: `f_bavail * f_frsize`);
///   a tmpfs mounted without a size limit reports none, and is checked
///   against `MemAvailable` instead;
/// - the cgroup memory limit ([`capacity::cgroup_memory`]): tmpfs pages are
///   charged to the memory cgroup of the process that touches them first.
///
/// When `statvfs` fails (for example `dir` does not exist) the first check
/// has no `free` figure (verdict unknown).
pub fn checks(need: u64, dir: &Path) -> Vec<CapacityCheck> {
    let space = pool_core::host::fs::space(dir);
    let tmpfs = matches!(filesystem_kind(dir), Ok(FsKind::Tmpfs));
    tmpfs_checks_with(
        need,
        dir,
        space,
        tmpfs,
        capacity::meminfo("MemAvailable"),
        capacity::cgroup_memory(),
    )
}

/// The tmpfs checks, over injectable sources.
fn tmpfs_checks_with(
    need: u64,
    dir: &Path,
    space: io::Result<Space>,
    tmpfs: bool,
    mem_available: Option<u64>,
    cgroup: Option<CgroupMemory>,
) -> Vec<CapacityCheck> {
    let d = dir.display();
    let source = format!("statvfs({d})");
    let mut checks = Vec::new();
    match space {
        Err(e) => checks.push(CapacityCheck::new(
            "shared-memory file system",
            &source,
            need,
            None,
            &format!("cannot statvfs {d}: {e}; create the directory or point the pool at /dev/shm"),
        )),
        Ok(s) if s.blocks == 0 && tmpfs => checks.push(CapacityCheck::new(
            &format!("memory (tmpfs {d} has no size limit)"),
            "MemAvailable in /proc/meminfo",
            need,
            mem_available,
            &format!(
                "{d} is a tmpfs without a size limit, so the node's memory bounds it: free memory \
                 on the node or ask for a smaller --size"
            ),
        )),
        Ok(s) => {
            let free = s.bavail.saturating_mul(s.frsize);
            let used = s.blocks.saturating_sub(s.bavail).saturating_mul(s.frsize);
            let gib = used.saturating_add(need).div_ceil(GIB).max(1);
            let remedy = format!(
                "{d} has {free_mib} MiB free, the pool needs {need_mib} MiB; grow it: docker run \
                 --shm-size={gib}g or --ipc=host; Kubernetes emptyDir {{medium: Memory, sizeLimit: \
                 {gib}Gi}}; or mount -o remount,size={gib}G {d}",
                free_mib = free / MIB,
                need_mib = need.div_ceil(MIB),
            );
            checks.push(CapacityCheck::new(
                "shared-memory file system",
                &source,
                need,
                Some(free),
                &remedy,
            ));
        }
    }
    if let Some(cg) = cgroup {
        checks.push(CapacityCheck::new(
            "cgroup memory limit",
            &cg.path.display().to_string(),
            need,
            Some(cg.free),
            &format!(
                "tmpfs pages are charged to the memory cgroup, which allows {} ({} usable); raise \
                 the container's memory limit (docker --memory, Kubernetes resources.limits.memory) \
                 or ask for a smaller --size",
                format_bytes(cg.limit),
                format_bytes(cg.free)
            ),
        ));
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool_core::host::capacity::Verdict;

    #[test]
    fn dev_shm_fits_a_mebibyte_and_not_a_pebibyte() {
        let small = checks(1 << 20, Path::new("/dev/shm"));
        assert!(
            small.iter().all(|c| c.verdict == Verdict::Fits),
            "{small:?}"
        );
        let huge = checks(1 << 50, Path::new("/dev/shm"));
        let c = &huge[0];
        assert_eq!(c.verdict, Verdict::Short, "{huge:?}");
        for want in [
            "/dev/shm has ",
            "the pool needs 1073741824 MiB",
            "--shm-size=",
            "--ipc=host",
            "medium: Memory",
            "mount -o remount,size=",
        ] {
            assert!(c.remedy.contains(want), "missing {want:?} in {}", c.remedy);
        }
        let missing = checks(1, Path::new("/nonexistent/shm"));
        assert_eq!(missing[0].verdict, Verdict::Unknown);
    }

    #[test]
    fn tmpfs_sizes_and_unlimited_tmpfs() {
        let dir = Path::new("/dev/shm");
        let space = Space {
            frsize: 4096,
            blocks: 16 << 18, // 16 GiB
            bavail: 2 << 18,  // 2 GiB free, 14 GiB used
        };
        let cg = CgroupMemory {
            path: PathBuf::from("/sys/fs/cgroup/memory.max"),
            limit: 8 << 30,
            free: 1 << 30,
        };
        let checks = tmpfs_checks_with(3 << 30, dir, Ok(space), true, None, Some(cg));
        assert_eq!(checks.len(), 2);
        assert_eq!(
            (checks[0].verdict, checks[0].free),
            (Verdict::Short, Some(2 << 30))
        );
        let r = &checks[0].remedy;
        assert!(
            r.contains("/dev/shm has 2048 MiB free, the pool needs 3072 MiB")
                && r.contains("--shm-size=17g")
                && r.contains("sizeLimit: 17Gi")
                && r.contains("remount,size=17G /dev/shm"),
            "{r}"
        );
        assert_eq!(checks[1].verdict, Verdict::Short);
        assert!(
            checks[1].remedy.contains("memory cgroup"),
            "{}",
            checks[1].remedy
        );
        // A tmpfs without size= reports 0 blocks: checked against memory.
        let unlimited = Space {
            frsize: 4096,
            blocks: 0,
            bavail: 0,
        };
        let c = tmpfs_checks_with(1 << 30, dir, Ok(unlimited), true, Some(2 << 30), None);
        assert_eq!((c.len(), c[0].verdict), (1, Verdict::Fits));
        assert!(c[0].resource.contains("no size limit"), "{:?}", c[0]);
        let err = io::Error::from_raw_os_error(libc::ENOENT);
        let c = tmpfs_checks_with(1, dir, Err(err), false, None, None);
        assert_eq!(c[0].verdict, Verdict::Unknown);
    }
}
