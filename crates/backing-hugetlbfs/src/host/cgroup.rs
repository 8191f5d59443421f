//! The hugetlb cgroup limits that bind this process, walked by
//! [`pool_core::host::cgroup`].

use std::path::{Path, PathBuf};

use serde::Serialize;

use pool_core::host::cgroup::{self, CgroupLimit, Controller, LimitFile};

use super::{GIB, KIB, MIB};

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

/// This process's hugetlb cgroup limit for the page size, if a finite one
/// binds it.
///
/// The group and its ancestors are walked by [`pool_core::host::cgroup`],
/// like the memory limit of
/// [`capacity::cgroup_memory`](pool_core::host::capacity::cgroup_memory); the files
/// read are
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::checks::cgroup_check;
    use crate::host::testing::{G1, M2, TempTree};
    use std::fs;

    /// [`cgroup_limit`] for the process whose `/proc/PID/cgroup` text is
    /// `own`, with its hierarchies under `root`.
    fn cgroup_limit_in(own: &str, root: &Path, page_size: u64) -> Option<HugetlbCgroup> {
        cgroup::tightest_in(own, root, &hugetlb_controller(page_size)).map(HugetlbCgroup::from)
    }

    #[test]
    fn names_of_page_sizes() {
        assert_eq!(cgroup_size_name(M2), "2MB");
        assert_eq!(cgroup_size_name(G1), "1GB");
        assert_eq!(cgroup_size_name(64 << 10), "64KB");
        assert_eq!(cgroup_size_name(32 << 20), "32MB");
        assert_eq!(cgroup_size_name(16 << 30), "16GB");
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
}
