//! A hugetlbfs mount's `size=` limit, from `statfs`.

use std::path::Path;

use serde::Serialize;

use pool_core::host::fs::{self as hostfs, FsInfo, HUGETLBFS_MAGIC, TMPFS_MAGIC};
use pool_core::{Error, Result};

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

/// What `statfs` says about a `dir` given to
/// [`capacity_checks`](super::capacity_checks).
#[derive(Debug)]
pub(super) enum MountProbe {
    /// Not hugetlbfs: no check.
    Other,
    /// hugetlbfs with a limit, or without one (`None`).
    Hugetlbfs(Option<MountLimit>),
    /// `statfs` failed.
    Unreadable(String),
}

/// `statfs(dir)` for the capacity checks.
pub(super) fn probe_mount(dir: &Path) -> MountProbe {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::testing::M2;

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
}
