//! What the tests of these modules share: page sizes, and a fake sysfs and
//! cgroup tree under the temp dir.

use std::fs;
use std::path::PathBuf;

use super::pools::Sysfs;

/// 2 MiB, the common huge page size.
pub(super) const M2: u64 = 2 << 20;
/// 1 GiB, the large one.
pub(super) const G1: u64 = 1 << 30;

/// A directory under the temp dir, removed on drop.
pub(super) struct TempTree(pub(super) PathBuf);

impl TempTree {
    pub(super) fn new(name: &str) -> TempTree {
        let dir = std::env::temp_dir().join(format!(
            "hostpool-hugetlb-test-{}-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempTree(dir)
    }

    pub(super) fn write(&self, rel: &str, text: &str) {
        let path = self.0.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    pub(super) fn sysfs(&self) -> Sysfs {
        Sysfs {
            hugepages: self.0.join("kernel/mm/hugepages"),
            nodes: self.0.join("devices/system/node"),
        }
    }

    /// A system pool: total, free, resv, surplus, overcommit.
    pub(super) fn pool(&self, kb: u64, c: [u64; 5]) {
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
    pub(super) fn node(&self, node: u32, kb: u64, c: [u64; 3]) {
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
