//! File-backed mappings: one or more files stitched into one contiguous range.
//!
//! The whole range is reserved `PROT_NONE` first (aligned to the page size),
//! then each file is mapped `MAP_SHARED | MAP_FIXED` at its offset, so a write
//! across a seam lands in the next file. Without `MAP_NORESERVE`, a hugetlbfs
//! mapping reserves its pages at `mmap`: a shortage is `ENOMEM` there, never a
//! SIGBUS later.
//!
//! Files are created `0600` with `O_NOFOLLOW | O_EXCL`: `/dev/shm` is
//! world-writable and a KV cache holds users' data. Existing files are opened
//! with `O_NOFOLLOW` and refused when another user owns them or their mode is
//! wider than `0600`. Private pools never leave a file behind: the file is an
//! `O_TMPFILE` or a `memfd`, or it is unlinked right after it is created.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::error::{Context, Error, Result, TeardownIssue};
use crate::layout::{Extent, MappedSize, PageSize, format_bytes};
use crate::plugin::{FilePlan, Mapping};
use crate::sys::{FixedMapError, Mmap, Placeholder, Region, Reservation};

/// A shared control file's view and its open-file-description locks: what
/// a rendezvous over a control file (`hostpool-handoff`'s) builds on.
pub use crate::sys::{AtomicsOnly, SharedView, ofd_byte_locked, ofd_lock_byte};

/// `(st_dev, st_ino)`: what a path named when we opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
}

/// The identity of an open file.
///
/// # Errors
/// The `fstat` errno.
pub fn file_id(fd: impl AsFd) -> io::Result<FileId> {
    id_and_len(fd).map(|(id, _)| id)
}

/// A file's identity and length, from one `fstat`.
///
/// # Errors
/// The `fstat` errno.
pub fn id_and_len(fd: impl AsFd) -> io::Result<(FileId, u64)> {
    let st = rustix::fs::fstat(fd)?;
    let id = FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    };
    Ok((id, u64::try_from(st.st_size).unwrap_or(0)))
}

/// The first of `files` that is shorter than its extent: its index and
/// length. Another holder of its descriptor truncated it, and every access
/// to the mapping past its new end would be a SIGBUS, so such a file must
/// be neither mapped nor touched.
///
/// # Errors
/// The `fstat` errno.
pub fn first_short<'a>(
    files: impl IntoIterator<Item = (BorrowedFd<'a>, Extent)>,
) -> io::Result<Option<(usize, u64)>> {
    for (i, (fd, extent)) in files.into_iter().enumerate() {
        let (_, len) = id_and_len(fd)?;
        if len < extent.len {
            return Ok(Some((i, len)));
        }
    }
    Ok(None)
}

/// One file of a pool and where it maps.
#[derive(Debug)]
pub struct PoolFile {
    /// The open file.
    pub fd: OwnedFd,
    /// The path while the file is linked and ours to unlink at teardown;
    /// `None` for unlinked, `O_TMPFILE` and memfd files.
    pub path: Option<PathBuf>,
    /// Its identity, for unlinking by inode.
    pub id: FileId,
    /// Where it maps in the pool.
    pub extent: Extent,
}

fn io_error(
    op: &'static str,
    path: Option<&Path>,
    size: u64,
    page: PageSize,
    remedy: &str,
    source: io::Error,
) -> Error {
    let mut context = Context::new(size, page).remedy(remedy);
    if let Some(path) = path {
        context = context.path(path);
    }
    Error::os(op, source, context)
}

/// Create a private, already-unlinked file of `len` bytes in `dir`:
/// `O_TMPFILE` where the filesystem has it, else a `0600` file created with
/// `O_EXCL | O_NOFOLLOW` and unlinked at once.
///
/// # Errors
/// [`Error::Os`] naming `dir`, for example when it does not exist or the
/// size cannot be set.
pub fn create_private(dir: &Path, len: u64, page: PageSize) -> Result<OwnedFd> {
    let mode = Mode::RUSR | Mode::WUSR;
    let fd = match rustix::fs::open(dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, mode) {
        Ok(fd) => fd,
        Err(e)
            if matches!(
                e.raw_os_error(),
                libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL
            ) =>
        {
            let name = dir.join(format!(
                ".hostpool-private-{}-{}",
                std::process::id(),
                unique()
            ));
            let fd = rustix::fs::open(
                &name,
                OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC,
                mode,
            )
            .map_err(|e| {
                io_error(
                    "create",
                    Some(&name),
                    len,
                    page,
                    "check that the directory exists and is writable",
                    e.into(),
                )
            })?;
            rustix::fs::unlink(&name).map_err(|e| {
                io_error(
                    "unlink",
                    Some(&name),
                    len,
                    page,
                    "check the directory's permissions",
                    e.into(),
                )
            })?;
            fd
        }
        Err(e) => {
            return Err(io_error(
                "open(O_TMPFILE)",
                Some(dir),
                len,
                page,
                "check that the directory exists, is writable, and is a hugetlbfs or tmpfs mount",
                e.into(),
            ));
        }
    };
    set_len(&fd, dir, len, page)?;
    Ok(fd)
}

/// The seals every memfd hostpool makes carries once it has its length: no
/// process that holds it (a rank, an engine on a lease, or anyone who opened
/// its `/proc/PID/fd/N`) can shrink it under the others, whose next touch of
/// the lost range would be a SIGBUS, nor grow it, and no seal can be taken
/// back (`F_SEAL_SEAL`).
pub const SIZE_SEALS: rustix::fs::SealFlags = rustix::fs::SealFlags::SHRINK
    .union(rustix::fs::SealFlags::GROW)
    .union(rustix::fs::SealFlags::SEAL);

/// Whether `fd`'s length is sealed ([`SIZE_SEALS`]): a memfd of ours.
/// Files in a directory (tmpfs, hugetlbfs `O_TMPFILE`) cannot take seals;
/// whoever maps them checks their lengths instead ([`map_files`]).
pub fn size_sealed(fd: impl AsFd) -> bool {
    rustix::fs::fcntl_get_seals(fd).is_ok_and(|s| s.contains(SIZE_SEALS))
}

/// A memfd (`memfd_create`) of `len` bytes, sealed against shrinking and
/// growing ([`SIZE_SEALS`]); with `hugetlb`, backed by huge pages of that
/// size (`MFD_HUGETLB | log2(page) << MFD_HUGE_SHIFT`), so no hugetlbfs
/// mount is needed.
///
/// # Errors
/// [`Error::NotAvailable`] when the kernel has no huge pages of that size;
/// [`Error::Os`] otherwise.
pub fn create_memfd(name: &str, len: u64, page: PageSize, hugetlb: bool) -> Result<OwnedFd> {
    let mut flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING;
    if hugetlb {
        let log2 = page.get().trailing_zeros();
        flags |=
            rustix::fs::MemfdFlags::HUGETLB | rustix::fs::MemfdFlags::from_bits_retain(log2 << 26);
    }
    let fd = rustix::fs::memfd_create(name, flags).map_err(|e| {
        if hugetlb && e.raw_os_error() == libc::EINVAL {
            Error::NotAvailable {
                what: format!("memfd with {page} huge pages"),
                reason: "the kernel rejected the page size; check /sys/kernel/mm/hugepages for the sizes it has".into(),
            }
        } else {
            io_error("memfd_create", None, len, page, "check the kernel supports memfd_create", e.into())
        }
    })?;
    set_len(&fd, Path::new("memfd"), len, page)?;
    rustix::fs::fcntl_add_seals(&fd, SIZE_SEALS).map_err(|e| {
        io_error(
            "fcntl(F_ADD_SEALS)",
            Some(Path::new("memfd")),
            len,
            page,
            "the kernel must allow sealing memfds (Linux 3.17, 4.16 for hugetlb memfds)",
            e.into(),
        )
    })?;
    Ok(fd)
}

fn set_len(fd: &OwnedFd, path: &Path, len: u64, page: PageSize) -> Result<()> {
    rustix::fs::ftruncate(fd, len).map_err(|e| {
        io_error(
            "ftruncate",
            Some(path),
            len,
            page,
            "the size must be a multiple of the page size, and the filesystem must have room",
            e.into(),
        )
    })
}

/// Create `path` exclusively: `O_CREAT | O_EXCL | O_NOFOLLOW`, mode `0600`.
///
/// # Errors
/// The `open` errno (`EEXIST` when it exists, even as a symlink).
pub fn create_exclusive(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?)
}

/// Open an existing pool file read-write without following symlinks, and
/// refuse it unless it is a regular file owned by this user with no group or
/// other permissions.
///
/// # Errors
/// [`Error::Conflict`] saying what is wrong with the file; the `open` errno
/// inside [`Error::Os`] otherwise.
pub fn open_checked(path: &Path, page: PageSize) -> Result<OwnedFd> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        let remedy = if e.raw_os_error() == libc::ELOOP {
            "it is a symbolic link; pool files are never followed through links: remove it"
        } else {
            "check that the pool's creator is running and the path is right"
        };
        io_error("open", Some(path), 0, page, remedy, e.into())
    })?;
    check_owner(&fd, path)?;
    Ok(fd)
}

/// Refuse a file that is not a regular file owned by us with mode `0600` or
/// narrower.
///
/// # Errors
/// [`Error::Conflict`] naming the file, its owner and mode (the node is in
/// the way, not the input: exit status 1); [`Error::Os`] when `fstat` fails.
pub fn check_owner(fd: &OwnedFd, path: &Path) -> Result<()> {
    let st = rustix::fs::fstat(fd).map_err(|e| {
        Error::os(
            "fstat",
            e,
            Context::file(path).remedy("check the pool file's path and permissions"),
        )
    })?;
    let conflict = |message: String| Error::Conflict {
        path: path.to_path_buf(),
        message,
    };
    let me = rustix::process::geteuid().as_raw();
    let mode = st.st_mode & 0o7777;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(conflict(format!(
            "refusing pool file {}: it is not a regular file; remove it",
            path.display()
        )));
    }
    if st.st_uid != me {
        return Err(conflict(format!(
            "refusing pool file {}: it is owned by uid {}, not by this process's uid {me}; a pool \
             holds users' data, so ranks must run as the same user (or remove the file)",
            path.display(),
            st.st_uid
        )));
    }
    if mode & 0o077 != 0 {
        return Err(conflict(format!(
            "refusing pool file {}: its mode is {mode:04o}, wider than 0600; other users could \
             read the KV cache (remove the file, or chmod 600 it if you trust its contents)",
            path.display()
        )));
    }
    Ok(())
}

/// Unlink `path` only if it still names `id`, so a stale generation never
/// deletes a newer live file. Returns whether it unlinked.
///
/// # Errors
/// The `stat` or `unlink` errno, except that a missing file is `Ok(false)`.
pub fn unlink_if_same(path: &Path, id: FileId) -> io::Result<bool> {
    match rustix::fs::lstat(path) {
        Ok(st) if st.st_dev == id.dev && st.st_ino == id.ino => match rustix::fs::unlink(path) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == libc::ENOENT => Ok(false),
            Err(e) => Err(e.into()),
        },
        Ok(_) => Ok(false),
        Err(e) if e.raw_os_error() == libc::ENOENT => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Retries of a lock probe that found the file locked.
const PROBE_RETRIES: u32 = 3;
/// Pause between them: far longer than a concurrent probe holds its lock.
const PROBE_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(5);

/// The lock probe of hostpool: take the file's `flock` exclusively when no
/// other process holds a lock on it. `Ok(true)`: taken, nobody else holds
/// the file (it stays locked until `fd` is closed or unlocked); `Ok(false)`:
/// another process holds it.
///
/// A pool's ranks hold their shared locks for the pool's whole life, while
/// another probe of the same file (`hostpool gc` or `doctor`, a creator
/// clearing a stale file, a joiner judging a control file) holds its
/// exclusive one for an instant. So a probe that finds the file locked tries
/// again a few times, a few milliseconds apart, before it says the file is
/// held: a concurrent probe does not make a free file look in use.
///
/// # Errors
/// The `flock` errno other than `EWOULDBLOCK`.
pub fn try_lock_exclusive(fd: impl AsFd) -> io::Result<bool> {
    let fd = fd.as_fd();
    for attempt in 0..=PROBE_RETRIES {
        match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(true),
            Err(e) if e.raw_os_error() == libc::EWOULDBLOCK => {
                if attempt < PROBE_RETRIES {
                    std::thread::sleep(PROBE_RETRY_DELAY);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}

fn unique() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// What to say when mapping a file fails.
#[derive(Debug, Clone, Default)]
pub struct MapContext {
    /// The remedy for `ENOMEM` at `mmap` (for hugetlbfs: too few huge pages).
    pub enomem_remedy: String,
    /// What to do about a file shorter than its extent, which another holder
    /// of it truncated (empty: remove or recreate the pool).
    pub truncated_remedy: String,
}

/// Map `files` contiguously into one range of `size.mapped()` bytes.
///
/// Every extent is checked before anything is mapped over the reservation:
/// inside it, page-aligned, not overlapping another, and together covering
/// `[0, mapped)`. `MAP_FIXED` only ever replaces this call's own `PROT_NONE`
/// reservation ([`crate::sys::Reservation`]), so no extent can reach memory
/// outside it.
///
/// # Errors
/// [`Error::Plugin`] for extents that are outside the pool, misaligned,
/// overlapping or leave a gap (nothing is mapped over anything then);
/// [`Error::Os`] naming the file, the segment's size and the page size for a
/// failed `mmap`, for `ENOMEM` with `ctx.enomem_remedy`. Nothing stays mapped
/// on error, and still-linked files are unlinked (by inode).
pub fn map_files(files: Vec<PoolFile>, size: MappedSize, ctx: &MapContext) -> Result<FileMapping> {
    let page = size.page();
    let mut files = Files(files);
    check_lengths(&files.0, page, ctx)?;
    let mut reservation = Reservation::new(size).map_err(|e| {
        Error::os(
            "mmap(PROT_NONE reservation)",
            e,
            Context::new(size.mapped(), page)
                .remedy("the address space is exhausted; ask for a smaller --size"),
        )
    })?;
    for file in &files.0 {
        match reservation.map_file(file.extent, file.fd.as_fd()) {
            Ok(()) => {}
            Err(FixedMapError::Os(e)) => {
                let remedy = if e.raw_os_error() == Some(libc::ENOMEM) {
                    ctx.enomem_remedy.clone()
                } else {
                    format!(
                        "mapping a {} segment at offset {} failed",
                        format_bytes(file.extent.len),
                        file.extent.offset
                    )
                };
                let mut c = Context::new(file.extent.len, page).remedy(remedy);
                if let Some(path) = &file.path {
                    c = c.path(path);
                }
                return Err(Error::os("mmap(MAP_SHARED)", e, c));
            }
            Err(bad) => {
                files.unlink_all();
                return Err(Error::Plugin {
                    what: "file mapping".into(),
                    message: format!(
                        "the backing's files do not tile the {} pool, nothing was mapped over them",
                        format_bytes(size.mapped())
                    ),
                    source: Some(Box::new(bad)),
                });
            }
        }
    }
    let mmap = reservation.finish().map_err(|(_, gap)| {
        files.unlink_all();
        Error::Plugin {
            what: "file mapping".into(),
            message: format!(
                "the backing's files do not tile the {} pool: {} at offset {} is covered by no file",
                format_bytes(size.mapped()),
                format_bytes(gap.len),
                gap.offset
            ),
            source: None,
        }
    })?;
    Ok(FileMapping { mmap, files })
}

/// Refuse to map a file shorter than its extent: whoever holds it (a peer
/// rank, a keeper's earlier lease, anyone who opened its `/proc/PID/fd/N`)
/// truncated it, and every access past its new end would be a SIGBUS. The
/// one length check of every path that maps files: a private pool's, a
/// shared pool's creator and joiners (socket or file rendezvous), and an
/// engine on a lease. A sealed memfd ([`SIZE_SEALS`]) cannot shrink after
/// this; a file in a directory can, which nothing but its holders' good
/// conduct prevents.
fn check_lengths(files: &[PoolFile], page: PageSize, ctx: &MapContext) -> Result<()> {
    let short = first_short(files.iter().map(|f| (f.fd.as_fd(), f.extent))).map_err(|e| {
        Error::os(
            "fstat",
            e,
            Context::new(0, page).remedy("a pool file handed to this process could not be read"),
        )
    })?;
    let Some((i, has)) = short else {
        return Ok(());
    };
    let file = &files[i];
    let remedy = if ctx.truncated_remedy.is_empty() {
        "recreate the pool"
    } else {
        ctx.truncated_remedy.as_str()
    };
    let path = file
        .path
        .clone()
        .unwrap_or_else(|| PathBuf::from("(unlinked)"));
    Err(Error::Conflict {
        message: format!(
            "file {i}{named} is {} long, shorter than its {} extent at offset {}: a process that \
             held it truncated it, and the memory past its end is gone; nothing was mapped; {remedy}",
            format_bytes(has),
            format_bytes(file.extent.len),
            file.extent.offset,
            named = file
                .path
                .as_ref()
                .map(|p| format!(" ({})", p.display()))
                .unwrap_or_default(),
        ),
        path,
    })
}

/// The files of a mapping; still-linked ones are unlinked (by inode) when
/// dropped.
#[derive(Debug)]
struct Files(Vec<PoolFile>);

impl Files {
    fn unlink_all(&mut self) -> Vec<TeardownIssue> {
        let mut issues = Vec::new();
        for f in self.0.drain(..) {
            let PoolFile { fd, path, id, .. } = f;
            drop(fd);
            if let Some(path) = path
                && let Err(e) = unlink_if_same(&path, id)
            {
                issues.push(TeardownIssue::log(
                    "unlink",
                    format!("{}: {e}", path.display()),
                ));
            }
        }
        issues
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        self.unlink_all();
    }
}

/// A live file-backed mapping; unmaps, closes and unlinks its still-linked
/// files (by inode) on teardown or drop.
#[derive(Debug)]
pub struct FileMapping {
    // Field order is drop order: unmap before the files are closed.
    mmap: Mmap,
    files: Files,
}

impl FileMapping {
    /// The files, in pool order.
    pub fn pool_files(&self) -> &[PoolFile] {
        &self.files.0
    }

    /// Forget the paths (the files were unlinked by someone else, for example
    /// the owner of a shared pool after its barrier).
    pub fn forget_paths(&mut self) {
        for f in &mut self.files.0 {
            f.path = None;
        }
    }

    /// Unmap, close, and unlink still-linked files by inode.
    pub fn release(self) -> Vec<TeardownIssue> {
        self.release_with(false).0
    }

    /// As [`FileMapping::release`], keeping the address range reserved
    /// when `keep_range` ([`crate::plugin::unmap_at_teardown`]): the files'
    /// memory is given back all the same.
    pub fn release_with(self, keep_range: bool) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        let FileMapping { mmap, mut files } = self;
        let (mut issues, kept) = crate::plugin::unmap_at_teardown(mmap, keep_range);
        issues.extend(files.unlink_all());
        (issues, kept)
    }
}

impl FileMapping {
    /// The mapped memory.
    pub fn region(&self) -> Region<'_> {
        self.mmap.region()
    }

    /// Allocate `extent`'s pages in the files before they are touched one
    /// byte at a time (the prefault fallback): `fallocate` fails with
    /// `ENOSPC` where a touch would die of SIGBUS.
    ///
    /// # Errors
    /// [`Error::Os`] naming the file, the range and the remedy.
    pub fn reserve(&self, extent: Extent) -> Result<()> {
        let page = self.mmap.region().page();
        for f in &self.files.0 {
            // The part of `extent` this file maps, as offsets into the file.
            let start = extent.offset.max(f.extent.offset);
            let end = extent.end().min(f.extent.end());
            if start >= end {
                continue;
            }
            let (offset, len) = (start - f.extent.offset, end - start);
            rustix::fs::fallocate(&f.fd, rustix::fs::FallocateFlags::empty(), offset, len)
                .map_err(|e| {
                    let mut c = Context::new(len, page).remedy(format!(
                        "offset {start} into the pool: the backing could not supply the pages \
                         (a full tmpfs or hugetlbfs mount, too few huge pages, or a hugetlb \
                         cgroup limit); nothing was touched, so no SIGBUS; run `hostpool plan` \
                         for the capacity checks"
                    ));
                    if let Some(p) = &f.path {
                        c = c.path(p);
                    }
                    Error::os("fallocate", e, c)
                })?;
        }
        Ok(())
    }

    /// The files that are still linked (named), which teardown unlinks.
    pub fn linked_files(&self) -> Vec<PathBuf> {
        self.files.0.iter().filter_map(|f| f.path.clone()).collect()
    }
}

/// A backing that maps files itself may hand them over as its mapping.
impl Mapping for FileMapping {
    fn region(&self) -> Region<'_> {
        self.mmap.region()
    }

    fn files(&self) -> Vec<PathBuf> {
        self.linked_files()
    }

    fn reserve_for_touch(&self, extent: Extent) -> Result<()> {
        self.reserve(extent)
    }

    fn teardown(self: Box<Self>) -> Vec<TeardownIssue> {
        self.release()
    }

    fn teardown_keeping_range(self: Box<Self>) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        self.release_with(true)
    }
}

/// Create the files a private pool's [`FilePlan`] asks for (in parallel,
/// each private and already unlinked) and map them contiguously: the core's
/// side of [`crate::plugin::MemorySource::Files`], so that no backing writes
/// the file → [`PoolFile`] → [`map_files`] sequence itself.
///
/// # Errors
/// The first file that could not be made (the others are closed), or as for
/// [`map_files`].
pub fn map_planned(plan: &FilePlan, size: MappedSize) -> Result<FileMapping> {
    let fds = create_all(plan)?;
    let files = fds
        .into_iter()
        .zip(plan.extents.iter().copied())
        .map(|(fd, extent)| {
            let id = file_id(&fd).map_err(|e| {
                Error::os(
                    "fstat",
                    e,
                    Context::new(extent.len, size.page())
                        .remedy("reading a new pool file's identity failed"),
                )
            })?;
            Ok(PoolFile {
                fd,
                path: None,
                id,
                extent,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    map_files(
        files,
        size,
        &MapContext {
            enomem_remedy: plan.enomem_remedy.clone(),
            ..MapContext::default()
        },
    )
}

/// Every extent's file, made on as many threads as there are cores (a
/// segmented pool of thousands of files is made in parallel).
fn create_all(plan: &FilePlan) -> Result<Vec<OwnedFd>> {
    let extents = &plan.extents;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(extents.len())
        .max(1);
    let per = extents.len().div_ceil(threads).max(1);
    let create = &*plan.create;
    let chunks: Vec<Result<Vec<OwnedFd>>> = std::thread::scope(|s| {
        let handles: Vec<_> = extents
            .chunks(per)
            .map(|chunk| s.spawn(move || chunk.iter().map(|e| create(*e)).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Plugin {
                        what: "pool files".into(),
                        message: "a file-creating thread panicked".into(),
                        source: None,
                    })
                })
            })
            .collect()
    });
    let mut out = Vec::with_capacity(extents.len());
    for c in chunks {
        out.extend(c?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::round_to_page;

    fn tmpdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "hostpool-file-test-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn two_files_map_contiguously_and_a_write_across_the_seam_lands_in_the_next() {
        let page = PageSize::BASE_4K;
        let size = round_to_page(8 << 20, page).unwrap();
        let mut files = Vec::new();
        for i in 0..2u64 {
            let fd = create_memfd("hostpool-test", 4 << 20, page, false).unwrap();
            let id = file_id(&fd).unwrap();
            files.push(PoolFile {
                fd,
                path: None,
                id,
                extent: Extent {
                    offset: i * (4 << 20),
                    len: 4 << 20,
                },
            });
        }
        let m = map_files(files, size, &MapContext::default()).unwrap();
        for (i, b) in [1u8, 2, 3, 4].into_iter().enumerate() {
            assert!(m.region().write_byte((4 << 20) - 2 + i as u64, b));
        }
        let mut b = [0u8; 2];
        rustix::io::pread(&m.pool_files()[1].fd, &mut b, 0).unwrap();
        assert_eq!(b, [3, 4]);
        assert!(m.release().is_empty());
    }

    /// A memfd is sealed against shrinking and growing, however it is
    /// reached (its descriptor, or the file reopened through
    /// `/proc/self/fd`), and its seals cannot be taken back; its bytes can
    /// still be written.
    #[test]
    fn a_memfd_is_sealed_against_shrinking_and_growing() {
        let fd = create_memfd("hostpool-sealed", 4 << 20, PageSize::BASE_4K, false).unwrap();
        assert!(size_sealed(&fd));
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ))
            .unwrap();
        for len in [0, 4096, 8 << 20] {
            assert_eq!(
                rustix::fs::ftruncate(&fd, len),
                Err(rustix::io::Errno::PERM)
            );
            assert_eq!(
                rustix::fs::ftruncate(&reopened, len),
                Err(rustix::io::Errno::PERM)
            );
        }
        assert_eq!(
            rustix::fs::fcntl_add_seals(&fd, rustix::fs::SealFlags::WRITE),
            Err(rustix::io::Errno::PERM),
            "F_SEAL_SEAL: no seal can be added or taken back"
        );
        assert_eq!(rustix::io::pwrite(&fd, b"ok", (4 << 20) - 2), Ok(2));
        assert_eq!(id_and_len(&fd).unwrap().1, 4 << 20);
        // A file in a directory cannot take seals: it is not reported sealed.
        let dir = tmpdir();
        let private = create_private(&dir, 1 << 20, PageSize::BASE_4K).unwrap();
        assert!(!size_sealed(&private));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file shorter than its extent (another holder truncated it) is
    /// refused by the one mapping path, naming it, and nothing is mapped.
    #[test]
    fn a_file_shorter_than_its_extent_is_never_mapped() {
        let dir = tmpdir();
        let size = round_to_page(4 << 20, PageSize::BASE_4K).unwrap();
        let mut files = Vec::new();
        for i in 0..2u64 {
            let fd = create_private(&dir, 2 << 20, PageSize::BASE_4K).unwrap();
            let id = file_id(&fd).unwrap();
            files.push(PoolFile {
                fd,
                path: Some(dir.join(format!("seg{i}"))),
                id,
                extent: Extent {
                    offset: i * (2 << 20),
                    len: 2 << 20,
                },
            });
        }
        rustix::fs::ftruncate(&files[1].fd, 1 << 20).unwrap();
        let maps_before = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count();
        let ctx = MapContext {
            truncated_remedy: "start the pool again".into(),
            ..MapContext::default()
        };
        let e = map_files(files, size, &ctx).expect_err("a short file is refused");
        let text = e.to_string();
        assert!(
            matches!(&e, Error::Conflict { path, .. } if path.ends_with("seg1"))
                && text.contains("file 1 (")
                && text.contains("is 1 MiB long, shorter than its 2 MiB extent at offset 2097152")
                && text.ends_with("nothing was mapped; start the pool again"),
            "{text}"
        );
        let maps_after = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count();
        assert!(
            maps_after <= maps_before + 2,
            "no reservation is left mapped"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn memfd_file(name: &str, offset: u64, len: u64) -> PoolFile {
        let fd = create_memfd(name, len.max(4096), PageSize::BASE_4K, false).unwrap();
        let id = file_id(&fd).unwrap();
        PoolFile {
            fd,
            path: None,
            id,
            extent: Extent { offset, len },
        }
    }

    fn maps_mention(name: &str) -> bool {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .contains(name)
    }

    #[test]
    fn bad_extents_are_an_error_and_never_a_map() {
        let size = round_to_page(8 << 20, PageSize::BASE_4K).unwrap();
        let ctx = MapContext::default();
        let mib = 1u64 << 20;
        type Case = (&'static str, Vec<(u64, u64)>, &'static str);
        let cases: [Case; 6] = [
            (
                "past-end",
                vec![(0, 4 * mib), (4 * mib, 8 * mib)],
                "outside",
            ),
            (
                "far-away",
                vec![(0, 8 * mib), (1 << 40, 4 * mib)],
                "outside",
            ),
            ("wrapping", vec![(u64::MAX - 4095, 8192)], "outside"),
            (
                "misaligned",
                vec![(0, 4 * mib + 1), (4 * mib + 1, 4 * mib - 1)],
                "aligned",
            ),
            (
                "overlap",
                vec![(0, 6 * mib), (4 * mib, 4 * mib)],
                "overlaps",
            ),
            (
                "gap",
                vec![(0, 2 * mib), (4 * mib, 4 * mib)],
                "covered by no file",
            ),
        ];
        for (tag, extents, want) in cases {
            let name = format!("hostpool-bad-extent-{tag}");
            let files = extents
                .iter()
                .map(|&(o, l)| memfd_file(&name, o, l))
                .collect();
            let e = map_files(files, size, &ctx).unwrap_err();
            let chain = format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
            assert!(chain.contains(want), "{tag}: {chain}");
            assert!(
                !e.is_usage(),
                "{tag}: a backing's bad extents are not the operator's input"
            );
            assert!(!maps_mention(&name), "{tag}: something stayed mapped");
        }
        // The same files, tiled properly, map.
        let name = "hostpool-good-extent";
        let m = map_files(
            vec![
                memfd_file(name, 0, 4 * mib),
                memfd_file(name, 4 * mib, 4 * mib),
            ],
            size,
            &ctx,
        )
        .unwrap();
        assert!(maps_mention(name));
        assert!(m.release().is_empty());
        assert!(!maps_mention(name));
    }

    #[test]
    fn private_files_leave_nothing_in_the_directory() {
        let dir = tmpdir();
        let fd = create_private(&dir, 1 << 20, PageSize::BASE_4K).unwrap();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "private file must be unlinked"
        );
        assert_eq!(rustix::fs::fstat(&fd).unwrap().st_size, 1 << 20);
        std::fs::remove_dir(&dir).unwrap();
        let e = create_private(Path::new("/nonexistent/dir"), 4096, PageSize::BASE_4K).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/dir"), "{e}");
    }

    #[test]
    fn exclusive_create_is_0600_refuses_symlinks_and_existing_files() {
        let dir = tmpdir();
        let p = dir.join("pool");
        let fd = create_exclusive(&p).unwrap();
        assert_eq!(rustix::fs::fstat(&fd).unwrap().st_mode & 0o777, 0o600);
        assert_eq!(
            create_exclusive(&p).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        let link = dir.join("link");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        assert_eq!(
            create_exclusive(&link).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        let e = open_checked(&link, PageSize::BASE_4K).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(open_checked(&p, PageSize::BASE_4K).is_ok());
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let e = open_checked(&p, PageSize::BASE_4K).unwrap_err();
        assert!(
            e.to_string().contains("0644") && e.to_string().contains("wider than 0600"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unlink_by_inode_spares_a_newer_file_at_the_same_path() {
        let dir = tmpdir();
        let p = dir.join("pool");
        let old = create_exclusive(&p).unwrap();
        let old_id = file_id(&old).unwrap();
        std::fs::remove_file(&p).unwrap();
        let new = create_exclusive(&p).unwrap();
        assert!(
            !unlink_if_same(&p, old_id).unwrap(),
            "must not unlink the newer file"
        );
        assert!(p.exists());
        assert!(unlink_if_same(&p, file_id(&new).unwrap()).unwrap());
        assert!(!p.exists());
        assert!(
            !unlink_if_same(&p, old_id).unwrap(),
            "missing file is not an error"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
