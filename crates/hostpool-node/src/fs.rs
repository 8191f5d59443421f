//! Facts about filesystems that several plugins read: what a directory is
//! on (`statfs`), its free space (`statvfs`), and the mount table
//! (`/proc/mounts`), each read in one place.

use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

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

/// What `statfs` says of a filesystem: its magic number, block size (for
/// hugetlbfs, its huge page size) and block counts (for hugetlbfs, the
/// `size=` limit in pages and the pages still free under it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsInfo {
    /// `f_type`, e.g. [`HUGETLBFS_MAGIC`] or [`TMPFS_MAGIC`].
    pub magic: u64,
    /// `f_bsize`.
    pub block_size: u64,
    /// `f_blocks`: 0 on a hugetlbfs or tmpfs without a size limit.
    pub blocks: u64,
    /// `f_bfree`.
    pub blocks_free: u64,
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

/// `statfs(path)`: magic number, block size and block counts. The one
/// `statfs` of hostpool.
///
/// # Errors
/// The `statfs` errno (for example `ENOENT`).
pub fn statfs_info(path: &Path) -> io::Result<FsInfo> {
    let st = rustix::fs::statfs(path)?;
    // f_type is a signed word on some targets; the magic numbers are 32-bit.
    Ok(FsInfo {
        magic: (st.f_type as u64) & 0xffff_ffff,
        block_size: st.f_bsize as u64,
        blocks: st.f_blocks,
        blocks_free: st.f_bfree,
    })
}

/// `statfs(path)` classified.
///
/// # Errors
/// The `statfs` errno (for example `ENOENT`).
pub fn filesystem_kind(path: &Path) -> io::Result<FsKind> {
    statfs_info(path).map(|i| i.kind())
}

/// The space figures of `statvfs`, in blocks of `frsize` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// `f_frsize` (`f_bsize` where `f_frsize` is 0).
    pub frsize: u64,
    /// `f_blocks`: 0 on a tmpfs without a size limit.
    pub blocks: u64,
    /// `f_bavail`: blocks free to unprivileged writers.
    pub bavail: u64,
}

impl Space {
    /// Total bytes (0: no limit, on tmpfs).
    pub fn total_bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.frsize)
    }

    /// Bytes free to unprivileged writers.
    pub fn free_bytes(&self) -> u64 {
        self.bavail.saturating_mul(self.frsize)
    }
}

/// `statvfs(dir)`: the one `statvfs` of hostpool.
///
/// # Errors
/// The `statvfs` errno (for example `ENOENT`).
pub fn space(dir: &Path) -> io::Result<Space> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(Space {
        frsize: if s.f_frsize > 0 {
            s.f_frsize
        } else {
            s.f_bsize
        },
        blocks: s.f_blocks,
        bavail: s.f_bavail,
    })
}

/// Bytes free in `dir` for unprivileged writers ([`space`]).
///
/// # Errors
/// The `statvfs` errno (for example `ENOENT`).
pub fn free_space(dir: &Path) -> io::Result<u64> {
    space(dir).map(|s| s.free_bytes())
}

/// One line of `/proc/mounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// What is mounted (`none`, a device).
    pub source: String,
    /// Where, with the kernel's octal escapes undone.
    pub point: PathBuf,
    /// The filesystem type, e.g. `hugetlbfs`, `tmpfs`.
    pub fstype: String,
    /// The mount options, e.g. `rw,relatime,pagesize=2M`.
    pub options: String,
}

/// The mount table (`/proc/mounts`), in mount order.
///
/// # Errors
/// The read's errno (no `/proc`).
pub fn mounts() -> io::Result<Vec<Mount>> {
    Ok(parse_mounts(&std::fs::read_to_string("/proc/mounts")?))
}

/// Parse the text of `/proc/mounts`; malformed lines are skipped.
pub fn parse_mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (source, point, fstype, options) = (f.next()?, f.next()?, f.next()?, f.next()?);
            Some(Mount {
                source: source.to_string(),
                point: unescape(point),
                fstype: fstype.to_string(),
                options: options.to_string(),
            })
        })
        .collect()
}

/// Undo the octal escapes of `/proc/mounts` (`\040` for a space, `\011`
/// tab, `\012` newline, `\134` backslash; see `fs/proc_namespace.c`).
fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(
            unescape("/mnt/huge\\040pages"),
            PathBuf::from("/mnt/huge pages")
        );
        assert_eq!(unescape("/a\\134b"), PathBuf::from("/a\\b"));
        assert_eq!(unescape("/t\\011ab"), PathBuf::from("/t\tab"));
        assert_eq!(unescape("/odd\\04"), PathBuf::from("/odd\\04"));
        assert_eq!(unescape("\\"), PathBuf::from("\\"));
    }

    #[test]
    fn the_mount_table_is_parsed_and_this_host_has_one() {
        let m = parse_mounts(
            "none /mnt/huge\\040pages hugetlbfs rw,pagesize=2M 0 0\nbroken\ntmpfs /dev/shm tmpfs rw 0 0\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].point, PathBuf::from("/mnt/huge pages"));
        assert_eq!(
            (m[0].fstype.as_str(), m[0].options.as_str()),
            ("hugetlbfs", "rw,pagesize=2M")
        );
        assert_eq!(m[1].source, "tmpfs");
        assert!(mounts().unwrap().iter().any(|m| m.point == Path::new("/")));
    }

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
    fn statfs_reports_block_counts() {
        // 64 KiB of our own in /dev/shm (not named hostpool-*, which gc
        // would take), so the used blocks are at least that many.
        let path = Path::new("/dev/shm").join(format!("statfs-test-{}", std::process::id()));
        std::fs::write(&path, vec![1u8; 64 << 10]).unwrap();
        let shm = statfs_info(Path::new("/dev/shm"));
        let vfs = space(Path::new("/dev/shm"));
        std::fs::remove_file(&path).unwrap();
        let (shm, vfs) = (shm.unwrap(), vfs.unwrap());
        assert_eq!(shm.kind(), FsKind::Tmpfs);
        assert_eq!(shm.blocks * shm.block_size, vfs.blocks * vfs.frsize);
        if shm.blocks > 0 {
            let used = (shm.blocks - shm.blocks_free) * shm.block_size;
            assert!(used >= 64 << 10, "{shm:?}");
        }
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
