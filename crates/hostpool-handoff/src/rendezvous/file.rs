//! The file rendezvous (`rendezvous = "file"`), for ranks that share only a
//! directory: a control file every rank maps (its layout is
//! `sys/control.rs`), the data files beside it. It follows vLLM's
//! (`shared_offload_region.py`, REFERENCE §1), and improves on it:
//!
//! - **Election without a half-made file.** The creator builds the control
//!   file as an `O_TMPFILE`, writes its header, takes its locks, and only
//!   then links it into place (`linkat`). The first link wins, so no joiner
//!   ever sees a stub of size 0.
//! - **Liveness by kernel locks.** Every rank holds an open-file-description
//!   lock on its own byte of the control file and a shared `flock` on it and
//!   on every data file. The kernel drops them when a process dies, however
//!   it dies. Peers tell "slow" from "dead" by them, and `hostpool gc` tells
//!   stale files from live ones.
//! - **A barrier that names the culprit.** A rank that fails marks its slot
//!   with its message, and with the ranks it blames when a peer made it fail
//!   (at most `MAX_BLAMED`); a rank that dies loses its lock. Either way its
//!   peers fail with a message naming it, never hang, and blame it, then
//!   whom it blamed. A rank that never attaches fails them after the attach
//!   timeout.
//! - **Unlink by inode.** After the barrier, and after a failure, every rank
//!   unlinks the control and data files (by inode, so a newer generation at
//!   the same path is never deleted). The memory lives on while mapped and is
//!   freed by the kernel even after SIGKILL.
//! - **Stale files replaced before the capacity check**, so a restart after a
//!   crash on a node with room for one pool starts at once.
//! - **Capacity checks in the creator only**: once it has reserved the pages,
//!   the free counts look too low to joiners.
//!
//! Files: `<control_dir>/hostpool-<name>.ctl` (default `/dev/shm`) and
//! `<dir>/hostpool-<name>.pool` or `.pool.<NNNN>` per segment, all `0600`.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, Mode, OFlags};

use super::{Role, SharedPoolSpec, SharingReport, known, peer, shard};
use crate::barrier::{Barrier, Event, Failure, Mark, Verdict};
use crate::sys::{Blamed, Ctl, MAX_BLAMED};
use pool_core::SharingConfig;
use pool_core::file::{self, FileId, FileMapping, PoolFile};
use pool_core::file::{SharedView, ofd_byte_locked, ofd_lock_byte};
use pool_core::gc::{DEFAULT_CONTROL_DIR, ctl_path};
use pool_core::host::capacity;
use pool_core::host::process::why_late;
use pool_core::interrupt::Cancel;
use pool_core::plugin::Mapping;
use pool_core::plugin::RankBarrier;
use pool_core::shared::{Attached, Attachment};
use pool_core::{Context, Error, Result, TeardownIssue};
use pool_core::{Extent, PageSize, format_bytes};
use pool_core::{Placeholder, Region};

const MAGIC: u64 = u64::from_le_bytes(*b"HOSTPOOL");
/// 2: each slot, and the header's creator failure, records whom it blamed.
const VERSION: u32 = 2;
const POLL: Duration = Duration::from_millis(2);
/// How long a joiner waits for its peers to let go of a dead pool's control
/// file before one of them removes the dead creator's files.
const ORPHAN_WAIT: Duration = Duration::from_millis(500);
/// Rank `r` holds an OFD lock on byte `LOCK_BASE + r` of the control file.
const LOCK_BASE: i64 = 1 << 30;

const POOL_CREATING: u32 = 0;
const POOL_READY: u32 = 1;
const POOL_FAILED: u32 = 2;

const SLOT_EMPTY: u32 = 0;
const SLOT_ATTACHED: u32 = 1;
const SLOT_ARRIVED: u32 = 2;
const SLOT_FAILED: u32 = 3;

impl std::fmt::Debug for Ctl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctl")
            .field("state", &self.header.state.load(Ordering::Relaxed))
            .field("world", &self.header.world.load(Ordering::Relaxed))
            .field("arrived", &self.header.arrived.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn write_msg(dst: &[AtomicU8], msg: &str) {
    let mut end = msg.len().min(dst.len() - 1);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    for (d, b) in dst
        .iter()
        .zip(msg.as_bytes()[..end].iter().chain(std::iter::once(&0)))
    {
        d.store(*b, Ordering::Relaxed);
    }
}

fn read_msg(src: &[AtomicU8]) -> String {
    let bytes: Vec<u8> = src
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .take_while(|b| *b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Record whom a failure blames: the first [`MAX_BLAMED`] of `ranks`.
fn write_blamed(dst: &Blamed, ranks: &[u32]) {
    let ranks = &ranks[..ranks.len().min(MAX_BLAMED)];
    for (d, r) in dst.ranks.iter().zip(ranks) {
        d.store(*r, Ordering::Relaxed);
    }
    dst.count.store(ranks.len() as u32, Ordering::Relaxed);
}

/// Whom the failure `owner` recorded blames, for its peers' [`Error::Peer`]:
/// `owner`, then the ranks it recorded, each once, in order.
fn read_blamed(owner: u32, src: &Blamed) -> Vec<u32> {
    let count = (src.count.load(Ordering::Relaxed) as usize).min(MAX_BLAMED);
    let mut ranks = vec![owner];
    for r in src.ranks[..count].iter().map(|r| r.load(Ordering::Relaxed)) {
        if !ranks.contains(&r) {
            ranks.push(r);
        }
    }
    ranks
}

/// The ranks `e` blames, for this rank to record with its failure: those
/// of an [`Error::Peer`], none for any other error (this rank's own).
fn blamed_by(e: &Error) -> &[u32] {
    match e {
        Error::Peer { ranks, .. } => ranks,
        _ => &[],
    }
}

/// One rank's attachment to a shared pool's control file.
#[derive(Debug)]
struct Session {
    sharing: SharingConfig,
    role: Role,
    ctl_path: PathBuf,
    ctl_fd: OwnedFd,
    ctl_id: FileId,
    view: SharedView<Ctl>,
    started: Instant,
    data: Vec<(PathBuf, FileId)>,
    /// The build's token, which every wait checks.
    cancel: Cancel,
}

fn control_dir(s: &SharingConfig) -> PathBuf {
    s.control_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONTROL_DIR))
}

impl Session {
    fn ctl(&self) -> &Ctl {
        self.view.get()
    }

    /// Elect a creator or join, within the attach timeout.
    fn elect(sharing: &SharingConfig, spec: &SharedPoolSpec<'_>) -> Result<Session> {
        let dir = control_dir(sharing);
        let path = ctl_path(&dir, &sharing.name);
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(sharing.attach_timeout_secs);
        loop {
            spec.cancel.check()?;
            if let Some(s) = Self::try_create(sharing, spec, &dir, &path, started)? {
                return Ok(s);
            }
            match Self::try_join(sharing, spec, &path, started, deadline)? {
                Some(s) => return Ok(s),
                None if Instant::now() < deadline => std::thread::sleep(POLL),
                None => {
                    return Err(peer(
                        format!(
                            "shared pool `{}`: could not create or join {} within {:.0} s",
                            sharing.name,
                            path.display(),
                            sharing.attach_timeout_secs
                        ),
                        Vec::new(),
                        None,
                    ));
                }
            }
        }
    }

    /// Build the control file as an O_TMPFILE and link it into place; `None`
    /// when another rank linked first.
    fn try_create(
        sharing: &SharingConfig,
        spec: &SharedPoolSpec<'_>,
        dir: &Path,
        path: &Path,
        started: Instant,
    ) -> Result<Option<Session>> {
        let len = SharedView::<Ctl>::len_for() as u64;
        let cfg_err = |op: &'static str, e: std::io::Error| {
            Error::os(
                op,
                e,
                Context::file(dir).remedy(format!(
                    "making the control file of shared pool `{}` failed; control_dir must be a \
                     writable tmpfs such as /dev/shm",
                    sharing.name
                )),
            )
        };
        let fd = rustix::fs::open(
            dir,
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| cfg_err("open(O_TMPFILE)", e.into()))?;
        rustix::fs::ftruncate(&fd, len).map_err(|e| cfg_err("ftruncate", e.into()))?;
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared)
            .map_err(|e| cfg_err("flock(LOCK_SH)", e.into()))?;
        ofd_lock_byte(fd.as_fd(), LOCK_BASE + i64::from(sharing.rank))
            .map_err(|e| cfg_err("fcntl(F_OFD_SETLK)", e))?;
        let view =
            SharedView::<Ctl>::map(fd.as_fd()).map_err(|e| cfg_err("mmap(MAP_SHARED)", e))?;
        let h = &view.get().header;
        h.version.store(VERSION, Ordering::Relaxed);
        h.world.store(sharing.world, Ordering::Relaxed);
        h.creator_rank.store(sharing.rank, Ordering::Relaxed);
        h.logical.store(spec.size.logical(), Ordering::Relaxed);
        h.mapped.store(spec.size.mapped(), Ordering::Relaxed);
        h.page_size.store(spec.size.page().get(), Ordering::Relaxed);
        h.nfiles.store(spec.files.len() as u32, Ordering::Relaxed);
        h.state.store(POOL_CREATING, Ordering::Relaxed);
        let slot = &view.get().slots[sharing.rank as usize];
        slot.pid.store(std::process::id(), Ordering::Relaxed);
        slot.state.store(SLOT_ATTACHED, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        match rustix::fs::linkat(
            rustix::fs::CWD,
            proc_path.as_str(),
            rustix::fs::CWD,
            path,
            rustix::fs::AtFlags::SYMLINK_FOLLOW,
        ) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == libc::EEXIST => return Ok(None),
            Err(e) => return Err(cfg_err("linkat", e.into())),
        }
        let ctl_id = file::file_id(&fd).map_err(|e| cfg_err("fstat", e))?;
        Ok(Some(Session {
            sharing: sharing.clone(),
            role: Role::Creator,
            ctl_path: path.to_path_buf(),
            ctl_fd: fd,
            ctl_id,
            view,
            started,
            data: Vec::new(),
            cancel: spec.cancel.clone(),
        }))
    }

    /// Open an existing control file, clear it away if stale, wait until the
    /// pool is ready, check it matches, claim our slot. `None` means "try the
    /// election again" (the file vanished or was stale).
    fn try_join(
        sharing: &SharingConfig,
        spec: &SharedPoolSpec<'_>,
        path: &Path,
        started: Instant,
        deadline: Instant,
    ) -> Result<Option<Session>> {
        let page = spec.size.page();
        let fd = match rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == libc::ENOENT => return Ok(None),
            Err(_) => {
                return Err(file::open_checked(path, page)
                    .err()
                    .unwrap_or_else(|| Error::config("control file vanished")));
            }
        };
        file::check_owner(&fd, path)?;
        let ctl_id = file::file_id(&fd).map_err(|e| {
            Error::os(
                "fstat",
                e,
                Context::file(path).remedy("reading the pool's control file failed"),
            )
        })?;
        // Stale: nobody holds it (a crashed earlier run). Clear it and retry.
        if matches!(file::try_lock_exclusive(&fd), Ok(true)) {
            tracing::warn!(
                "removing stale control file {} left by a crashed run",
                path.display()
            );
            let _ = file::unlink_if_same(path, ctl_id);
            return Ok(None);
        }
        // Someone holding it exclusively is clearing it as stale: it is about
        // to vanish, so try the election again.
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == libc::EWOULDBLOCK => return Ok(None),
            Err(e) => {
                return Err(Error::os(
                    "flock(LOCK_SH)",
                    e,
                    Context::file(path).remedy("locking the pool's control file failed"),
                ));
            }
        }
        let view = match SharedView::<Ctl>::map(fd.as_fd()) {
            Ok(v) => v,
            Err(e) => {
                return Err(Error::Conflict {
                    path: path.to_path_buf(),
                    message: format!(
                        "{} is not a hostpool control file ({e}); remove it, or pick another \
                         --shared name",
                        path.display()
                    ),
                });
            }
        };
        let s = Session {
            sharing: sharing.clone(),
            role: Role::Joiner,
            ctl_path: path.to_path_buf(),
            ctl_fd: fd,
            ctl_id,
            view,
            started,
            data: Vec::new(),
            cancel: spec.cancel.clone(),
        };
        if s.ctl().header.magic.load(Ordering::Acquire) != MAGIC
            || s.ctl().header.version.load(Ordering::Relaxed) != VERSION
        {
            return Err(Error::config(format!(
                "{} is not a hostpool control file of this version; remove it (`hostpool gc`)",
                path.display()
            )));
        }
        // The header's sizes are written before the file is linked, so they
        // can be checked, and the slot claimed, before the pool is ready: a
        // creator that fails then knows this rank is waiting for its verdict.
        s.check_matches(spec)?;
        s.claim_slot()?;
        if let Err(e) = s.wait_ready(spec, deadline) {
            s.fail_with(&e);
            return Err(e);
        }
        Ok(Some(s))
    }

    fn creator_pid(&self) -> u32 {
        let r = self.ctl().header.creator_rank.load(Ordering::Relaxed);
        self.ctl()
            .slots
            .get(r as usize)
            .map_or(0, |s| s.pid.load(Ordering::Relaxed))
    }

    fn creator_rank(&self) -> u32 {
        self.ctl().header.creator_rank.load(Ordering::Relaxed)
    }

    fn creator_desc(&self) -> String {
        format!("rank {} (pid {})", self.creator_rank(), self.creator_pid())
    }

    /// A peer error that blames the creator, by its rank and pid in the
    /// control file.
    fn creator_peer(&self, message: String) -> Error {
        peer(
            message,
            vec![self.creator_rank()],
            known(self.creator_pid()),
        )
    }

    fn wait_ready(&self, spec: &SharedPoolSpec<'_>, deadline: Instant) -> Result<()> {
        let h = &self.ctl().header;
        loop {
            match h.state.load(Ordering::Acquire) {
                POOL_READY => return Ok(()),
                POOL_FAILED => {
                    // The creator, then whom it blamed.
                    return Err(peer(
                        format!(
                            "shared pool `{}`: its creator {} failed: {}",
                            self.sharing.name,
                            self.creator_desc(),
                            read_msg(&h.fail_msg)
                        ),
                        read_blamed(self.creator_rank(), &h.fail_blamed),
                        known(self.creator_pid()),
                    ));
                }
                _ => {}
            }
            let gone = rustix::fs::fstat(&self.ctl_fd)
                .map(|st| st.st_nlink == 0)
                .unwrap_or(true);
            let creator = i64::from(h.creator_rank.load(Ordering::Relaxed));
            let dead = !ofd_byte_locked(self.ctl_fd.as_fd(), LOCK_BASE + creator).unwrap_or(false);
            if gone || dead {
                if dead {
                    self.remove_orphans(spec);
                }
                let _ = file::unlink_if_same(&self.ctl_path, self.ctl_id);
                return Err(self.creator_peer(format!(
                    "shared pool `{}`: its creator {} {} before the pool was ready",
                    self.sharing.name,
                    self.creator_desc(),
                    if dead { "died" } else { "removed it" }
                )));
            }
            self.cancel.check()?;
            if Instant::now() >= deadline {
                return Err(self.creator_peer(format!(
                    "shared pool `{}` was not ready after {:.0} s: its creator {} is still creating it \
                     ({}); raise --attach-timeout for very large pools",
                    self.sharing.name,
                    self.sharing.attach_timeout_secs,
                    self.creator_desc(),
                    pool_core::host::process::why_late(self.creator_pid())
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Joiner, after the creator died before the pool was ready: remove the
    /// data files it had made, which no process holds any more (on
    /// hugetlbfs they keep their pages reserved). One joiner does it, holding
    /// the dead pool's control file exclusively while that file still names
    /// it, so no rank can have started a new pool of the same name meanwhile.
    fn remove_orphans(&self, spec: &SharedPoolSpec<'_>) {
        // Let go of our shared lock so that one of the joiners can take the
        // exclusive one once all have let go.
        let _ = rustix::fs::flock(&self.ctl_fd, FlockOperation::Unlock);
        let end = Instant::now() + ORPHAN_WAIT;
        while rustix::fs::flock(&self.ctl_fd, FlockOperation::NonBlockingLockExclusive).is_err() {
            if Instant::now() >= end {
                return;
            }
            std::thread::sleep(POLL);
        }
        let still_ours = rustix::fs::lstat(&self.ctl_path)
            .is_ok_and(|st| st.st_dev == self.ctl_id.dev && st.st_ino == self.ctl_id.ino);
        if !still_ours {
            return;
        }
        for (path, _) in &spec.files {
            let Ok(fd) = rustix::fs::open(
                path,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            ) else {
                continue;
            };
            let free = file::check_owner(&fd, path).is_ok()
                && matches!(file::try_lock_exclusive(&fd), Ok(true));
            if let (true, Ok(id)) = (free, file::file_id(&fd)) {
                tracing::warn!(
                    "removing {} left by the creator of `{}`, which died before the pool was ready",
                    path.display(),
                    self.sharing.name
                );
                let _ = file::unlink_if_same(path, id);
            }
        }
    }

    fn check_matches(&self, spec: &SharedPoolSpec<'_>) -> Result<()> {
        let h = &self.ctl().header;
        let theirs = (
            h.world.load(Ordering::Relaxed),
            h.logical.load(Ordering::Relaxed),
            h.mapped.load(Ordering::Relaxed),
            h.page_size.load(Ordering::Relaxed),
            h.nfiles.load(Ordering::Relaxed) as usize,
        );
        let ours = (
            self.sharing.world,
            spec.size.logical(),
            spec.size.mapped(),
            spec.size.page().get(),
            spec.files.len(),
        );
        if theirs != ours {
            return Err(Error::config(format!(
                "shared pool `{}` was created for {} ranks, {} ({} mapped) in {} pages and {} file(s); this \
                 rank asks for {} ranks, {} ({} mapped) in {} pages and {} file(s). Every rank must use the \
                 same size, page size, segments and world; if it is a leftover of an earlier run, stop its \
                 processes and run `hostpool gc`",
                self.sharing.name,
                theirs.0,
                format_bytes(theirs.1),
                format_bytes(theirs.2),
                format_bytes(theirs.3),
                theirs.4,
                ours.0,
                format_bytes(ours.1),
                format_bytes(ours.2),
                format_bytes(ours.3),
                ours.4
            )));
        }
        Ok(())
    }

    fn claim_slot(&self) -> Result<()> {
        let rank = self.sharing.rank;
        let slot = &self.ctl().slots[rank as usize];
        if let Err(e) = ofd_lock_byte(self.ctl_fd.as_fd(), LOCK_BASE + i64::from(rank)) {
            return Err(Error::config(format!(
                "rank {rank} of shared pool `{}` is already attached by pid {} ({e}); give each process its own --rank",
                self.sharing.name,
                slot.pid.load(Ordering::Relaxed)
            )));
        }
        if slot.state.load(Ordering::Acquire) != SLOT_EMPTY {
            return Err(Error::config(format!(
                "rank {rank} of shared pool `{}` was already used by pid {} (which has exited); the pool \
                 cannot take a second rank {rank}: restart all ranks",
                self.sharing.name,
                slot.pid.load(Ordering::Relaxed)
            )));
        }
        slot.pid.store(std::process::id(), Ordering::Relaxed);
        slot.state.store(SLOT_ATTACHED, Ordering::Release);
        Ok(())
    }

    /// Creator: remove the data files of this pool that a crashed run left
    /// (no process holds them; this rank won the election, so no live pool
    /// has the name), before the capacity checks count them as used.
    /// Returns whether it removed any.
    ///
    /// # Errors
    /// [`Error::Conflict`] for a file of another user, or one a live
    /// process holds; [`Error::Os`] when it cannot be examined or removed.
    fn clear_stale(&self, spec: &SharedPoolSpec<'_>) -> Result<bool> {
        let page = spec.size.page();
        let mut cleared = false;
        for (path, extent) in &spec.files {
            if !path.exists() {
                continue;
            }
            let old = file::open_checked(path, page)?;
            if !matches!(file::try_lock_exclusive(&old), Ok(true)) {
                return Err(self.in_use(path));
            }
            let os = |op, e: std::io::Error| {
                Error::os(
                    op,
                    e,
                    Context::new(extent.len, page)
                        .path(path)
                        .remedy("a stale pool file could not be removed; run `hostpool gc`"),
                )
            };
            let id = file::file_id(&old).map_err(|e| os("fstat", e))?;
            tracing::warn!(
                "removing stale pool file {} left by a crashed run",
                path.display()
            );
            cleared |= file::unlink_if_same(path, id).map_err(|e| os("unlink", e))?;
        }
        Ok(cleared)
    }

    fn in_use(&self, path: &Path) -> Error {
        Error::Conflict {
            path: path.to_path_buf(),
            message: format!(
                "pool file {} is in use by another process: a pool named `{}` already exists; \
                 pick another --shared name or stop that pool",
                path.display(),
                self.sharing.name
            ),
        }
    }

    /// Creator: create one data file exclusively, clearing a stale leftover.
    fn create_data(&mut self, path: &Path, extent: Extent, page: PageSize) -> Result<PoolFile> {
        let os = |op, e: std::io::Error| {
            Error::os(
                op,
                e,
                Context::new(extent.len, page)
                    .path(path)
                    .remedy("check that the directory exists and is writable"),
            )
        };
        let fd = match file::create_exclusive(path) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let old = file::open_checked(path, page)?;
                if !matches!(file::try_lock_exclusive(&old), Ok(true)) {
                    return Err(self.in_use(path));
                }
                tracing::warn!(
                    "removing stale pool file {} left by a crashed run",
                    path.display()
                );
                let id = file::file_id(&old).map_err(|e| os("fstat", e))?;
                file::unlink_if_same(path, id).map_err(|e| os("unlink", e))?;
                file::create_exclusive(path).map_err(|e| os("create", e))?
            }
            Err(e) => return Err(os("create", e)),
        };
        let id = file::file_id(&fd).map_err(|e| os("fstat", e))?;
        self.data.push((path.to_path_buf(), id));
        // Blocking: `hostpool gc` holds a file exclusively for an instant
        // while it checks it (and keeps it, since our control file is live).
        rustix::fs::flock(&fd, FlockOperation::LockShared).map_err(|e| os("flock", e.into()))?;
        rustix::fs::ftruncate(&fd, extent.len).map_err(|e| os("ftruncate", e.into()))?;
        Ok(PoolFile {
            fd,
            path: Some(path.to_path_buf()),
            id,
            extent,
        })
    }

    /// Joiner: open one data file and check it is the creator's.
    fn open_data(
        &mut self,
        index: usize,
        path: &Path,
        extent: Extent,
        page: PageSize,
    ) -> Result<PoolFile> {
        let fd = file::open_checked(path, page)?;
        let id = file::file_id(&fd).map_err(|e| {
            Error::os(
                "fstat",
                e,
                Context::new(extent.len, page)
                    .path(path)
                    .remedy("reading a pool file failed"),
            )
        })?;
        let want = &self.ctl().files[index];
        let want = FileId {
            dev: want[0].load(Ordering::Relaxed),
            ino: want[1].load(Ordering::Relaxed),
        };
        if id != want {
            return Err(Error::Conflict {
                path: path.to_path_buf(),
                message: format!(
                    "{} is not the file the creator of `{}` made (a leftover of another run?); \
                     stop all ranks and run `hostpool gc`",
                    path.display(),
                    self.sharing.name
                ),
            });
        }
        let size = rustix::fs::fstat(&fd)
            .map(|st| st.st_size as u64)
            .unwrap_or(0);
        if size != extent.len {
            return Err(Error::config(format!(
                "{} is {} but this rank expects {}; every rank must use the same size",
                path.display(),
                format_bytes(size),
                format_bytes(extent.len)
            )));
        }
        // Blocking, for the same reason as in `create_data`.
        rustix::fs::flock(&fd, FlockOperation::LockShared).map_err(|e| {
            Error::os(
                "flock(LOCK_SH)",
                e,
                Context::new(extent.len, page)
                    .path(path)
                    .remedy("locking a pool file failed"),
            )
        })?;
        self.data.push((path.to_path_buf(), id));
        Ok(PoolFile {
            fd,
            path: Some(path.to_path_buf()),
            id,
            extent,
        })
    }

    /// The first failure another rank has recorded, as a peer error that
    /// names and blames it, and then whom it blamed.
    fn peer_failure(&self) -> Option<Error> {
        let ctl = self.ctl();
        (0..self.sharing.world)
            .filter(|r| *r != self.sharing.rank)
            .find_map(|r| {
                let slot = &ctl.slots[r as usize];
                (slot.state.load(Ordering::Acquire) == SLOT_FAILED).then(|| {
                    let pid = slot.pid.load(Ordering::Relaxed);
                    peer(
                        format!(
                            "shared pool `{}`: rank {r} (pid {pid}) failed: {}",
                            self.sharing.name,
                            read_msg(&slot.msg)
                        ),
                        read_blamed(r, &slot.blamed),
                        known(pid),
                    )
                })
            })
    }

    /// Creator: the files exist and are mapped; let the joiners in.
    fn publish(&self) {
        let ctl = self.ctl();
        for (i, (_, id)) in self.data.iter().enumerate() {
            ctl.files[i][0].store(id.dev, Ordering::Relaxed);
            ctl.files[i][1].store(id.ino, Ordering::Relaxed);
        }
        ctl.header.state.store(POOL_READY, Ordering::Release);
    }

    /// This rank failed: tell the peers, and whom it blames (`blamed`, empty
    /// when the failure is its own), free the memory (unlink the data files
    /// by inode), and keep the control file linked until every rank has
    /// attached or the attach deadline has passed, so that every rank of this
    /// run reads the cause instead of starting a new pool and timing out.
    fn fail(&self, message: &str, blamed: &[u32]) {
        self.mark_failed(message, blamed);
        for (path, id) in &self.data {
            let _ = file::unlink_if_same(path, *id);
        }
        let ctl = self.ctl();
        let deadline = self.started + Duration::from_secs_f64(self.sharing.attach_timeout_secs);
        while Instant::now() < deadline
            && self.cancel.requested().is_none()
            && (0..self.sharing.world)
                .any(|r| ctl.slots[r as usize].state.load(Ordering::Acquire) == SLOT_EMPTY)
        {
            std::thread::sleep(POLL);
        }
        let _ = file::unlink_if_same(&self.ctl_path, self.ctl_id);
    }

    /// [`Self::fail`] with the error `e`: its message, and the ranks it
    /// blames.
    fn fail_with(&self, e: &Error) {
        self.fail(&e.to_string(), blamed_by(e));
    }

    fn mark_failed(&self, message: &str, blamed: &[u32]) {
        let ctl = self.ctl();
        let slot = &ctl.slots[self.sharing.rank as usize];
        write_msg(&slot.msg, message);
        write_blamed(&slot.blamed, blamed);
        slot.state.store(SLOT_FAILED, Ordering::Release);
        if self.role == Role::Creator && ctl.header.state.load(Ordering::Acquire) == POOL_CREATING {
            write_msg(&ctl.header.fail_msg, message);
            write_blamed(&ctl.header.fail_blamed, blamed);
            ctl.header
                .fail_rank
                .store(self.sharing.rank, Ordering::Relaxed);
            ctl.header.state.store(POOL_FAILED, Ordering::Release);
        }
    }

    fn unlink_all(&self) -> Vec<TeardownIssue> {
        let mut issues = Vec::new();
        for (path, id) in self
            .data
            .iter()
            .chain(std::iter::once(&(self.ctl_path.clone(), self.ctl_id)))
        {
            if let Err(e) = file::unlink_if_same(path, *id) {
                issues.push(TeardownIssue::log(
                    "unlink",
                    format!("{}: {e}", path.display()),
                ));
            }
        }
        issues
    }

    /// The built-in barrier over the control file.
    fn barrier(&self, outcome: std::result::Result<(), String>) -> Result<()> {
        let ctl = self.ctl();
        let (me, world) = (self.sharing.rank, self.sharing.world);
        if let Err(msg) = outcome {
            self.fail(&msg, &[]);
            return Err(peer(
                format!("rank {me} failed: {msg}"),
                vec![me],
                Some(std::process::id()),
            ));
        }
        ctl.slots[me as usize]
            .state
            .store(SLOT_ARRIVED, Ordering::Release);
        if ctl.header.arrived.fetch_add(1, Ordering::AcqRel) + 1 == world {
            ctl.header.done.store(1, Ordering::Release);
        }
        // Each rank judges the others from their slots, as a holder does
        // from its sockets: through the one barrier.
        let barrier = Barrier::shared(
            &self.sharing,
            self.started + Duration::from_secs_f64(self.sharing.attach_timeout_secs),
            Instant::now() + Duration::from_secs_f64(self.sharing.barrier_timeout_secs),
        );
        loop {
            if ctl.header.done.load(Ordering::Acquire) == 1 {
                return Ok(());
            }
            if let Err(e) = self.cancel.check() {
                // Tell the peers at once, rather than let them wait for us.
                self.fail(&format!("rank {me} was interrupted: {e}"), &[]);
                return Err(e);
            }
            let mut marks = Vec::with_capacity(world as usize);
            let mut problem = None;
            for r in 0..world {
                let slot = &ctl.slots[r as usize];
                let pid = slot.pid.load(Ordering::Relaxed);
                let state = slot.state.load(Ordering::Acquire);
                if state == SLOT_EMPTY {
                    continue;
                }
                // A rank that failed is named with whom it blamed.
                if state == SLOT_FAILED {
                    problem = problem.or(Some(Failure {
                        message: format!(
                            "shared pool `{}`: rank {r} (pid {pid}) failed: {}",
                            self.sharing.name,
                            read_msg(&slot.msg)
                        ),
                        ranks: read_blamed(r, &slot.blamed),
                        pid: known(pid),
                    }));
                    continue;
                }
                let mark = Mark {
                    rank: r,
                    pid,
                    arrived: state == SLOT_ARRIVED,
                    present: r == me
                        || ofd_byte_locked(self.ctl_fd.as_fd(), LOCK_BASE + i64::from(r))
                            .unwrap_or(true),
                };
                if !mark.present {
                    problem = problem.or_else(|| barrier.on(&mark, &Event::Gone));
                }
                marks.push(mark);
            }
            let failed =
                problem.or_else(|| match barrier.settle(&marks, Instant::now(), why_late) {
                    Some(Verdict::Failed(f)) => Some(f),
                    Some(Verdict::Go) | None => None,
                });
            // A rank that passed the barrier may exit at once: only a
            // barrier that is still open makes its absence a failure.
            if let Some(f) = failed
                && ctl.header.done.load(Ordering::Acquire) == 0
            {
                self.fail(&f.message, &f.ranks);
                return Err(f.into());
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Create or join the pool `spec` describes over the file rendezvous. The
/// creator checks capacity, creates and sizes the files and maps them before
/// letting the joiners in; joiners verify they attach to exactly those files.
///
/// # Errors
/// Capacity, mapping, mismatch or peer errors. On error the peers are told
/// and no file is left behind.
pub(super) fn map(spec: SharedPoolSpec<'_>) -> Result<Box<dyn Attachment>> {
    let sharing = spec.sharing;
    let mut session = Session::elect(sharing, &spec)?;
    let page = spec.size.page();
    let attempt = (|| -> Result<FileMapping> {
        let mut files = Vec::with_capacity(spec.files.len());
        if session.role == Role::Creator {
            let checks = if session.clear_stale(&spec)? {
                (spec.recheck)()
            } else {
                spec.capacity.to_vec()
            };
            capacity::require(&checks).map_err(|e| with_gc_hint(e, &spec))?;
            for (path, extent) in &spec.files {
                files.push(session.create_data(path, *extent, page)?);
            }
        } else {
            for (i, (path, extent)) in spec.files.iter().enumerate() {
                // A peer that already failed has unlinked the files: say so,
                // rather than "no such file".
                let opened = match session.peer_failure() {
                    Some(p) => Err(p),
                    None => session.open_data(i, path, *extent, page),
                };
                files.push(opened.map_err(|e| session.peer_failure().unwrap_or(e))?);
            }
        }
        file::map_files(files, spec.size, &spec.map)
    })();
    match attempt {
        Ok(mapping) => {
            if session.role == Role::Creator {
                pool_core::failpoint::stall("shared-before-ready");
                session.publish();
            }
            let shard = shard(spec.size, sharing)?;
            Ok(Box::new(SharedMapping {
                inner: mapping,
                session: Unpassed {
                    session,
                    passed: AtomicBool::new(false),
                },
                shard,
            }))
        }
        Err(e) => {
            session.fail_with(&e);
            Err(e)
        }
    }
}

/// A capacity shortfall says so when stale pool files of crashed runs (of
/// other pools) hold room in the pool's directories, and names `gc`.
fn with_gc_hint(e: Error, spec: &SharedPoolSpec<'_>) -> Error {
    let Error::Capacity {
        resource,
        need,
        free,
        remedy,
    } = e
    else {
        return e;
    };
    let mut dirs: Vec<PathBuf> = spec
        .files
        .iter()
        .filter_map(|(p, _)| p.parent().map(Path::to_path_buf))
        .collect();
    dirs.dedup();
    let found = pool_core::gc::scan(&dirs);
    let stale: Vec<&pool_core::gc::Scanned> = found
        .files
        .iter()
        .filter(|f| matches!(f.liveness, pool_core::gc::Liveness::Stale { .. }))
        .collect();
    let remedy = if stale.is_empty() {
        remedy
    } else {
        let bytes: u64 = stale.iter().map(|f| f.bytes).sum();
        let dir_list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        format!(
            "{remedy}; {} stale pool file(s) of crashed runs hold {} there: `hostpool gc --dir {}` \
             removes them",
            stale.len(),
            format_bytes(bytes),
            dir_list.join(" --dir ")
        )
    };
    Error::Capacity {
        resource,
        need,
        free,
        remedy,
    }
}

/// A rank's mapping of a shared pool.
#[derive(Debug)]
pub struct SharedMapping {
    // Field order is drop order: unmap before the session's files go.
    inner: FileMapping,
    session: Unpassed,
    shard: Extent,
}

/// A session whose files are removed when dropped before the barrier passed.
#[derive(Debug)]
struct Unpassed {
    session: Session,
    passed: AtomicBool,
}

impl std::ops::Deref for Unpassed {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.session
    }
}

impl Unpassed {
    fn passed(&self) -> bool {
        self.passed.load(Ordering::Acquire)
    }
}

impl Drop for Unpassed {
    fn drop(&mut self) {
        if !self.passed() {
            self.session.unlink_all();
        }
    }
}

impl Mapping for SharedMapping {
    fn region(&self) -> Region<'_> {
        self.inner.region()
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut v = self.inner.files();
        if !self.session.passed() {
            v.push(self.session.ctl_path.clone());
        }
        v
    }

    fn reserve_for_touch(&self, extent: Extent) -> Result<()> {
        self.inner.reserve_for_touch(extent)
    }

    fn teardown(self: Box<Self>) -> Vec<TeardownIssue> {
        self.release(false).0
    }

    fn teardown_keeping_range(self: Box<Self>) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        self.release(true)
    }
}

impl Attachment for SharedMapping {
    fn pool_files(&self) -> &[pool_core::file::PoolFile] {
        self.inner.pool_files()
    }

    fn attached(&self) -> Attached {
        Attached::Shared(SharingReport::of(
            &self.session.sharing,
            self.session.role,
            self.shard,
            self.session.ctl_path.display().to_string(),
        ))
    }

    fn rendezvous(
        &mut self,
        outcome: std::result::Result<(), String>,
        barrier: Option<&dyn RankBarrier>,
    ) -> Result<()> {
        let s = &self.session;
        let result = match barrier {
            Some(b) => {
                let r = b.wait(s.sharing.rank, s.sharing.world, outcome);
                if let Err(e) = &r {
                    s.fail_with(e);
                }
                r
            }
            None => s.barrier(outcome),
        };
        if result.is_ok() {
            self.session.passed.store(true, Ordering::Release);
            pool_core::failpoint::stall("shared-after-barrier");
            // Every rank unlinks (by inode, so a newer pool's files are
            // spared): whichever rank dies after the barrier, the others
            // leave nothing behind.
            for issue in s.unlink_all() {
                tracing::warn!("after the barrier: {}", issue.detail);
            }
            self.inner.forget_paths();
        }
        result
    }
}

impl SharedMapping {
    fn release(self, keep_range: bool) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        let SharedMapping { inner, session, .. } = self;
        let (mut issues, kept) = inner.release_with(keep_range);
        if !session.passed() {
            // Never passed the barrier: make sure nothing is left behind.
            issues.extend(session.unlink_all());
        }
        (issues, kept)
    }
}

#[cfg(test)]
mod tests {
    use pool_core::gc::data_path;
    use std::sync::Barrier;

    use super::super::tests::{Dirs, attach, blamed, on_ranks, role, sharing};
    use super::*;
    use pool_core::host::capacity::CapacityCheck;

    #[test]
    fn four_ranks_elect_one_creator_share_memory_and_leave_no_file() {
        let d = Dirs::new("ok");
        let results = on_ranks(4, |r| {
            let mut m = attach(&d, &sharing(&d, 4, r, 10.0), 16, &[]).unwrap();
            // Each rank writes its rank number at the start of its shard.
            let shard = shard(m.region().size(), &sharing(&d, 4, r, 10.0)).unwrap();
            assert_eq!(shard.len, 4 << 20);
            assert!(m.region().write_byte(shard.offset, r as u8 + 1));
            m.rendezvous(Ok(()), None).unwrap();
            // After the barrier every rank sees every rank's write.
            let region = m.region();
            let seen: Vec<u8> = (0..4u64)
                .map(|i| region.read_byte(i * (4 << 20)).unwrap())
                .collect();
            (role(&*m), seen, m)
        });
        let creators = results
            .iter()
            .filter(|(role, _, _)| role == "creator")
            .count();
        assert_eq!(creators, 1, "exactly one creator");
        for (_, seen, _) in &results {
            assert_eq!(seen, &[1, 2, 3, 4]);
        }
        assert!(
            d.left().is_empty(),
            "files left after the barrier: {:?}",
            d.left()
        );
        for (_, _, m) in results {
            assert!(m.teardown().is_empty());
        }
    }

    #[test]
    fn a_rank_that_fails_fails_its_peers_with_its_name_and_nothing_is_left() {
        let d = Dirs::new("fail");
        let errs: Vec<Error> = on_ranks(3, |r| {
            // A peer learns of the failure at attach (if rank 2 failed
            // first) or at the barrier; either way it is named.
            match attach(&d, &sharing(&d, 3, r, 10.0), 4, &[]) {
                Err(e) => e,
                Ok(mut m) => {
                    let outcome = if r == 2 {
                        Err("prefault exploded".to_string())
                    } else {
                        Ok(())
                    };
                    let e = m.rendezvous(outcome, None).unwrap_err();
                    m.teardown();
                    e
                }
            }
        });
        let me = Some(std::process::id());
        for (r, e) in errs[..2].iter().enumerate() {
            let text = e.to_string();
            assert!(
                text.contains("rank 2") && text.contains("prefault exploded"),
                "{text}"
            );
            // The file rendezvous blames the slot it read: rank 2's, or
            // that of the other survivor if it failed first, relaying, and
            // then rank 2, whom that slot blames.
            let (ranks, pid) = blamed(e);
            let other = 1 - r as u32;
            assert!(ranks == [2] || ranks == [other, 2], "{ranks:?}: {text}");
            assert_eq!(pid, me, "{text}");
        }
        assert_eq!(
            blamed(&errs[2]),
            (vec![2], me),
            "its own failure names itself"
        );
        assert!(d.left().is_empty(), "{:?}", d.left());
    }

    /// World 3: rank 2 dies after attaching; rank 1 reaches the barrier,
    /// sees it dead and fails, recording in its slot that it blames rank 2;
    /// rank 0 then reaches the barrier, reads rank 1's slot first, and
    /// blames rank 1, then rank 2, whom rank 1's failure names.
    #[test]
    fn a_rank_that_fails_because_of_a_dead_peer_passes_the_blame_on() {
        let d = Dirs::new("relay");
        let me = std::process::id();
        let (attached, gone) = (Barrier::new(3), Barrier::new(3));
        // Ranks 0 and 1 only: rank 0 waits on it until rank 1 has failed.
        let relayed = Barrier::new(2);
        let errs: Vec<Option<Error>> = on_ranks(3, |r| {
            let mut m = attach(&d, &sharing(&d, 3, r, 10.0), 4, &[]).unwrap();
            attached.wait();
            if r == 2 {
                drop(m);
                gone.wait();
                return None;
            }
            gone.wait();
            if r == 0 {
                relayed.wait();
            }
            let e = m.rendezvous(Ok(()), None).unwrap_err();
            if r == 1 {
                relayed.wait();
            }
            m.teardown();
            Some(e)
        });
        let (Some(e0), Some(e1)) = (&errs[0], &errs[1]) else {
            panic!("ranks 0 and 1 must fail: {errs:?}");
        };
        let died = format!("rank 2 (pid {me}) died before the barrier completed");
        assert!(e1.to_string().contains(&died), "{e1}");
        assert_eq!(blamed(e1), (vec![2], Some(me)), "{e1}");
        let text = e0.to_string();
        assert!(
            text.contains(&format!("rank 1 (pid {me}) failed")) && text.contains(&died),
            "{text}"
        );
        assert_eq!(blamed(e0), (vec![1, 2], Some(me)), "{text}");
        assert!(d.left().is_empty(), "{:?}", d.left());
    }

    /// A slot records at most `MAX_BLAMED` ranks; its readers blame its
    /// owner first, then each rank it recorded once, in order.
    #[test]
    fn a_recorded_blame_is_bounded_and_read_owner_first_each_rank_once() {
        let b = Blamed::default();
        assert_eq!(read_blamed(4, &b), [4], "nothing recorded: the owner");
        let many: Vec<u32> = (10..10 + MAX_BLAMED as u32 + 3).collect();
        write_blamed(&b, &many);
        assert_eq!(b.count.load(Ordering::Relaxed), MAX_BLAMED as u32);
        let want: Vec<u32> = std::iter::once(4)
            .chain(many[..MAX_BLAMED].iter().copied())
            .collect();
        assert_eq!(read_blamed(4, &b), want);
        write_blamed(&b, &[2, 4, 2, 1]);
        assert_eq!(read_blamed(4, &b), [4, 2, 1]);
        // A count beyond the bound (a foreign or torn file) is clamped:
        // the entries past the last record's are the first one's.
        b.count.store(u32::MAX, Ordering::Relaxed);
        assert_eq!(read_blamed(4, &b), [4, 2, 1, 14, 15, 16, 17]);
    }

    /// A capacity check the creator fails: 4 MiB needed, 1 MiB free.
    fn short_of_memory() -> [CapacityCheck; 1] {
        [CapacityCheck::new(
            "memory",
            "test",
            4 << 20,
            Some(1 << 20),
            "add memory",
        )]
    }

    #[test]
    fn a_rank_that_never_comes_times_out_with_its_number() {
        let d = Dirs::new("absent");
        let mut m = attach(&d, &sharing(&d, 2, 0, 0.3), 4, &[]).unwrap();
        let e = m.rendezvous(Ok(()), None).unwrap_err();
        assert!(e.to_string().contains("rank(s) 1 never attached"), "{e}");
        assert_eq!(blamed(&e), (vec![1], None), "{e}");
        m.teardown();
        assert!(d.left().is_empty(), "{:?}", d.left());
    }

    /// A creator that fails before the pool is ready (here: too little
    /// memory) is blamed by the joiners with the rank and pid the control
    /// file's header gives.
    #[test]
    fn a_creator_that_fails_is_blamed_by_its_rank_and_pid_from_the_control_file() {
        let d = Dirs::new("creator-fails");
        let short = short_of_memory();
        let results = on_ranks(2, |r| attach(&d, &sharing(&d, 2, r, 5.0), 4, &short));
        let creator = results
            .iter()
            .position(|res| matches!(res, Err(Error::Capacity { .. })))
            .expect("the creator fails its capacity check") as u32;
        let Err(e) = &results[1 - creator as usize] else {
            panic!("the joiner must fail");
        };
        assert!(
            e.to_string().contains(&format!(
                "its creator rank {creator} (pid {}) failed",
                std::process::id()
            )),
            "{e}"
        );
        assert_eq!(blamed(e), (vec![creator], Some(std::process::id())), "{e}");
        assert!(d.left().is_empty(), "{:?}", d.left());
    }

    #[test]
    fn a_mismatched_size_or_duplicate_rank_is_refused() {
        let d = Dirs::new("mismatch");
        let creator = attach(&d, &sharing(&d, 3, 0, 5.0), 4, &[]).unwrap();
        let e = attach(&d, &sharing(&d, 3, 1, 5.0), 8, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("was created for 3 ranks, 4 MiB") && e.contains("8 MiB"),
            "{e}"
        );
        let e = attach(&d, &sharing(&d, 3, 0, 5.0), 4, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0") && e.contains("already attached"),
            "{e}"
        );
        drop(creator);
        assert!(d.left().is_empty(), "{:?}", d.left());
    }

    #[test]
    fn a_creator_short_of_capacity_fails_and_leaves_nothing() {
        let d = Dirs::new("short");
        let short = short_of_memory();
        let e = attach(&d, &sharing(&d, 2, 0, 0.5), 4, &short).unwrap_err();
        assert!(matches!(e, Error::Capacity { .. }), "{e}");
        assert!(d.left().is_empty(), "{:?}", d.left());
    }

    #[test]
    fn stale_control_and_data_files_of_a_crashed_run_are_replaced() {
        let d = Dirs::new("stale");
        let s = sharing(&d, 1, 0, 5.0);
        std::fs::write(ctl_path(&d.ctl, "unit"), b"garbage from a crash").unwrap();
        std::fs::set_permissions(
            ctl_path(&d.ctl, "unit"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let stale_data = data_path(&d.data, "unit", None);
        std::fs::write(&stale_data, b"old").unwrap();
        std::fs::set_permissions(
            &stale_data,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let mut m = attach(&d, &s, 4, &[]).unwrap();
        assert_eq!(role(&*m), "creator");
        m.rendezvous(Ok(()), None).unwrap();
        assert!(d.left().is_empty(), "{:?}", d.left());
        m.teardown();
    }

    #[test]
    fn a_control_file_of_another_user_or_wide_mode_is_refused() {
        let d = Dirs::new("owner");
        let p = ctl_path(&d.ctl, "unit");
        std::fs::write(&p, b"x").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        let e = attach(&d, &sharing(&d, 1, 0, 1.0), 4, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("wider than 0600"), "{e}");
        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let e = attach(&d, &sharing(&d, 1, 0, 1.0), 4, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("owned by uid 65534"), "{e}");
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        let e = attach(&d, &sharing(&d, 1, 0, 1.0), 4, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }

    #[test]
    fn an_engine_barrier_replaces_the_built_in_one() {
        struct Engine(std::sync::Mutex<Vec<(u32, bool)>>);
        impl RankBarrier for Engine {
            fn wait(
                &self,
                rank: u32,
                _world: u32,
                outcome: std::result::Result<(), String>,
            ) -> Result<()> {
                self.0.lock().unwrap().push((rank, outcome.is_ok()));
                Ok(())
            }
        }
        let d = Dirs::new("engine");
        let engine = Engine(Default::default());
        let mut m = attach(&d, &sharing(&d, 1, 0, 5.0), 4, &[]).unwrap();
        m.rendezvous(Ok(()), Some(&engine)).unwrap();
        assert_eq!(*engine.0.lock().unwrap(), [(0, true)]);
        assert!(
            d.left().is_empty(),
            "the creator unlinks after the engine's barrier: {:?}",
            d.left()
        );
        m.teardown();
    }
}
