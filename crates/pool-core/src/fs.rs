//! What kind of filesystem a directory is on (`statfs`).

use std::io;
use std::path::Path;

/// `HUGETLBFS_MAGIC` from `include/uapi/linux/magic.h` (rustix lacks it).
pub const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;
/// `TMPFS_MAGIC` from `include/uapi/linux/magic.h`.
pub const TMPFS_MAGIC: u64 = 0x0102_1994;

/// The filesystem kinds pool backings care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    /// A hugetlbfs mount; `f_bsize` is its huge page size.
    Hugetlbfs {
        /// The mount's page size in bytes.
        page_size: u64,
    },
    /// tmpfs, for example `/dev/shm`.
    Tmpfs,
    /// Anything else, with its magic number.
    Other {
        /// `f_type` from `statfs`.
        magic: u64,
    },
}

/// What `statfs` says of a filesystem: its magic number and block size
/// (for hugetlbfs, its huge page size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsInfo {
    /// `f_type`, e.g. [`HUGETLBFS_MAGIC`] or [`TMPFS_MAGIC`].
    pub magic: u64,
    /// `f_bsize`.
    pub block_size: u64,
}

impl FsInfo {
    /// Classified.
    pub fn kind(&self) -> FsKind {
        match self.magic {
            HUGETLBFS_MAGIC => FsKind::Hugetlbfs {
                page_size: self.block_size,
            },
            TMPFS_MAGIC => FsKind::Tmpfs,
            magic => FsKind::Other { magic },
        }
    }
}

/// `statfs(path)`: magic number and block size.
///
/// # Errors
/// The `statfs` errno (for example `ENOENT`).
pub fn statfs_info(path: &Path) -> io::Result<FsInfo> {
    let st = rustix::fs::statfs(path)?;
    // f_type is a signed word on some targets; the magic numbers are 32-bit.
    Ok(FsInfo {
        magic: (st.f_type as u64) & 0xffff_ffff,
        block_size: st.f_bsize as u64,
    })
}

/// `statfs(path)` classified.
///
/// # Errors
/// The `statfs` errno (for example `ENOENT`).
pub fn filesystem_kind(path: &Path) -> io::Result<FsKind> {
    statfs_info(path).map(|i| i.kind())
}

/// Bytes free in `dir` for unprivileged writers: `statvfs` `f_bavail ×
/// f_frsize` (`f_bsize` where `f_frsize` is 0).
///
/// # Errors
/// The `statvfs` errno (for example `ENOENT`).
pub fn free_space(dir: &Path) -> io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    let frsize = if s.f_frsize > 0 {
        s.f_frsize
    } else {
        s.f_bsize
    };
    Ok(s.f_bavail.saturating_mul(frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_reads_statvfs() {
        assert!(free_space(Path::new("/dev/shm")).unwrap() > 0);
        assert_eq!(
            free_space(Path::new("/nonexistent/x"))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOENT)
        );
    }

    #[test]
    fn proc_is_other_and_missing_dirs_are_errors() {
        assert!(matches!(
            filesystem_kind(Path::new("/proc")),
            Ok(FsKind::Other { .. })
        ));
        let e = filesystem_kind(Path::new("/nonexistent/x")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}
