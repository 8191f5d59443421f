//! Garbage collection of pool files that crashed processes left behind.
//!
//! A file is stale when no live process holds a lock on it: every attached
//! rank holds a shared `flock` on the control file and on each data file, and
//! the kernel drops those when a process dies (DPDK finds stale hugepage files
//! the same way). A data file whose pool's control file is still locked is
//! live too, which covers the instant between a creator making a file and
//! locking it. Only files named `hostpool-*` (or `.hostpool-*`) are looked
//! at, symbolic links are never followed, and a file is unlinked only if its
//! path still names the inode that was found stale. [`scan`] is the
//! read-only half, which `hostpool doctor` uses to list what `gc` would
//! remove.

use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use serde::Serialize;

use crate::file::{self, FileId};
use crate::plugin::{BackingPlugin, PluginRecord};

/// Prefix of every file hostpool creates.
pub const FILE_PREFIX: &str = "hostpool-";
/// Default directory of shared pools' control files.
pub const DEFAULT_CONTROL_DIR: &str = "/dev/shm";

/// The control file of a shared pool.
pub fn ctl_path(control_dir: &Path, name: &str) -> PathBuf {
    control_dir.join(format!("{FILE_PREFIX}{name}.ctl"))
}

/// The data file of a shared pool: `index` is `None` for a one-file pool.
pub fn data_path(dir: &Path, name: &str, index: Option<usize>) -> PathBuf {
    match index {
        None => dir.join(format!("{FILE_PREFIX}{name}.pool")),
        Some(i) => dir.join(format!("{FILE_PREFIX}{name}.pool.{i:04}")),
    }
}

/// What `gc` found in one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcEntry {
    /// The file.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Why it was kept, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What `gc` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Directories scanned.
    pub dirs: Vec<String>,
    /// Stale files removed.
    pub removed: Vec<GcEntry>,
    /// Files kept because a live process holds them (or they could not be examined).
    pub kept: Vec<GcEntry>,
    /// Bytes given back.
    pub freed_bytes: u64,
}

/// The directories `gc` scans by default: the default control directory of
/// shared pools ([`DEFAULT_CONTROL_DIR`]), then the directories each backing's
/// record names ([`BackingPlugin::gc_dirs`]; with the shipped backings,
/// `/dev/shm` and every hugetlbfs mount), backings in the order of their
/// names, each directory once.
pub fn default_dirs() -> Vec<PathBuf> {
    dirs_of(BackingPlugin::all())
}

/// The control directory and the `gc_dirs` of these records.
fn dirs_of(mut records: Vec<&BackingPlugin>) -> Vec<PathBuf> {
    records.sort_by_key(|r| r.name);
    let mut dirs = vec![PathBuf::from(DEFAULT_CONTROL_DIR)];
    for dir in records.iter().filter_map(|r| r.gc_dirs).flat_map(|f| f()) {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// The pool name of a hostpool file name (`hostpool-NAME.ctl`,
/// `hostpool-NAME.pool`, `hostpool-NAME.pool.0003`), if it is one.
pub fn pool_name(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix(FILE_PREFIX)?;
    if let Some(n) = rest.strip_suffix(".ctl") {
        return Some(n);
    }
    let (name, tail) = rest.split_once(".pool")?;
    (tail.is_empty()
        || tail
            .strip_prefix('.')
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())))
    .then_some(name)
}

/// Whether a file name is one hostpool creates (a pool's control or data
/// file, or a private file caught between its creation and its unlink).
pub fn is_pool_file(file_name: &str) -> bool {
    pool_name(file_name).is_some() || file_name.starts_with(".hostpool-private-")
}

/// Whether another process holds a lock on the file: open it and take its
/// lock with the one probe, [`file::try_lock_exclusive`] (which retries a
/// few times, a few milliseconds apart, so that another gc or doctor
/// probing the same file is not taken for a live holder). The file's fd
/// (locked), identity and size when nobody holds it.
fn locked(path: &Path) -> std::io::Result<Option<(std::os::fd::OwnedFd, FileId, u64)>> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    let id = FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    };
    Ok(file::try_lock_exclusive(&fd)?.then_some((fd, id, st.st_size as u64)))
}

fn ctl_is_live(dir: &Path, name: &str) -> bool {
    [dir, Path::new(DEFAULT_CONTROL_DIR)]
        .iter()
        .map(|d| ctl_path(d, name))
        .any(|p| p.exists() && matches!(locked(&p), Ok(None)))
}

/// How a pool file stands.
#[derive(Debug)]
pub enum Liveness {
    /// A live process holds it (or its pool's control file); the reason.
    Live(String),
    /// No process holds it: what a crashed run left. While this value lives
    /// it holds the file's exclusive lock, so no pool can take the file
    /// between the scan and its removal.
    Stale {
        /// The file's identity when it was found stale.
        id: FileId,
        /// The exclusive lock of the probe.
        lock: std::os::fd::OwnedFd,
    },
    /// It could not be examined; why.
    Unknown(String),
}

/// One pool file found by [`scan`].
#[derive(Debug)]
pub struct Scanned {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Whether a live process holds it.
    pub liveness: Liveness,
}

/// What [`scan`] found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The pool files, in each directory data files first, then control
    /// files, each sorted by name.
    pub files: Vec<Scanned>,
    /// The directories that cannot be read.
    pub unreadable: Vec<PathBuf>,
}

/// Judge every pool file in `dirs` live or stale by the lock probe (try to
/// take its `flock` exclusively, without waiting), the one liveness check
/// of hostpool: the kernel drops a dead process's locks in any PID
/// namespace, so a holder in another container still counts as live. The
/// probe changes nothing on disk; stale files stay locked by the returned
/// [`Scan`] until it is dropped.
pub fn scan(dirs: &[PathBuf]) -> Scan {
    let mut scan = Scan::default();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            scan.unreadable.push(dir.clone());
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| is_pool_file(n))
            .collect();
        // Data files before control files, so a data file is judged while
        // its control file still says whether the pool is live.
        names.sort_by_key(|n| (n.ends_with(".ctl"), n.clone()));
        for name in names {
            let path = dir.join(&name);
            let (bytes, liveness) = match locked(&path) {
                Ok(None) => (
                    file_size(&path),
                    Liveness::Live("held by a live process".into()),
                ),
                Err(e) => (
                    file_size(&path),
                    Liveness::Unknown(format!("cannot be examined: {e}")),
                ),
                Ok(Some((_, _, bytes)))
                    if !name.ends_with(".ctl")
                        && pool_name(&name).is_some_and(|n| ctl_is_live(dir, n)) =>
                {
                    (
                        bytes,
                        Liveness::Live("its pool's control file is held by a live process".into()),
                    )
                }
                Ok(Some((lock, id, bytes))) => (bytes, Liveness::Stale { id, lock }),
            };
            scan.files.push(Scanned {
                path,
                bytes,
                liveness,
            });
        }
    }
    scan
}

/// Remove the stale pool files in `dirs`, keep the live ones.
pub fn collect(dirs: &[PathBuf]) -> GcReport {
    let found = scan(dirs);
    let mut report = GcReport {
        dirs: dirs.iter().map(|d| d.display().to_string()).collect(),
        ..GcReport::default()
    };
    for dir in &found.unreadable {
        report.kept.push(GcEntry {
            path: dir.display().to_string(),
            bytes: 0,
            reason: Some("directory cannot be read".into()),
        });
    }
    for f in found.files {
        let path = f.path.display().to_string();
        let keep = |reason: String| GcEntry {
            path: path.clone(),
            bytes: f.bytes,
            reason: Some(reason),
        };
        match f.liveness {
            Liveness::Live(reason) | Liveness::Unknown(reason) => report.kept.push(keep(reason)),
            Liveness::Stale { id, lock } => {
                // Unlinked while the probe's exclusive lock is still held.
                match file::unlink_if_same(&f.path, id) {
                    Ok(true) => {
                        report.freed_bytes += f.bytes;
                        report.removed.push(GcEntry {
                            path: path.clone(),
                            bytes: f.bytes,
                            reason: None,
                        });
                    }
                    Ok(false) => {}
                    Err(e) => report.kept.push(keep(format!("cannot be removed: {e}"))),
                }
                drop(lock);
            }
        }
    }
    report
}

fn file_size(path: &Path) -> u64 {
    std::fs::symlink_metadata(path)
        .map(|m| m.len())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::FlockOperation;

    #[test]
    fn names_are_recognised_exactly() {
        assert_eq!(pool_name("hostpool-e0.ctl"), Some("e0"));
        assert_eq!(pool_name("hostpool-e0.pool"), Some("e0"));
        assert_eq!(pool_name("hostpool-e0.pool.0003"), Some("e0"));
        assert_eq!(pool_name("hostpool-e0.poolside"), None);
        assert_eq!(pool_name("vllm_offload_x.mmap"), None);
        assert_eq!(pool_name("hostpool-e0.pool."), None);
        assert!(is_pool_file(".hostpool-private-1-2"));
        assert!(!is_pool_file("hostpool"));
    }

    #[test]
    fn stale_files_go_live_files_and_strangers_stay() {
        let dir = std::env::temp_dir().join(format!("hostpool-gc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stale = dir.join("hostpool-dead.pool");
        std::fs::write(&stale, vec![0u8; 8192]).unwrap();
        let live = dir.join("hostpool-alive.pool.0000");
        std::fs::write(&live, b"x").unwrap();
        let holder = std::fs::File::open(&live).unwrap();
        rustix::fs::flock(&holder, FlockOperation::LockShared).unwrap();
        let stranger = dir.join("vllm_offload_1.mmap");
        std::fs::write(&stranger, b"x").unwrap();
        let link = dir.join("hostpool-link.pool");
        std::os::unix::fs::symlink(&stranger, &link).unwrap();

        let r = collect(std::slice::from_ref(&dir));
        assert_eq!(r.removed.len(), 1, "{r:?}");
        assert_eq!(r.removed[0].path, stale.display().to_string());
        assert_eq!(r.freed_bytes, 8192);
        assert!(!stale.exists());
        assert!(live.exists(), "a locked file must stay");
        assert!(r.kept.iter().any(|k| k.path == live.display().to_string()));
        assert!(
            stranger.exists() && link.symlink_metadata().is_ok(),
            "strangers and links are never touched"
        );
        drop(holder);
        let r = collect(std::slice::from_ref(&dir));
        assert_eq!(r.removed.len(), 1, "once released it is stale: {r:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_dirs_start_with_dev_shm() {
        assert_eq!(default_dirs()[0], PathBuf::from("/dev/shm"));
    }

    fn no_build(_: Option<&serde_json::Value>) -> crate::Result<Box<dyn crate::plugin::Backing>> {
        Err(crate::Error::config("a test record builds nothing"))
    }

    #[test]
    fn default_dirs_come_from_the_records_sorted_and_deduplicated() {
        fn shm() -> Vec<PathBuf> {
            vec![PathBuf::from("/dev/shm")]
        }
        fn huge() -> Vec<PathBuf> {
            vec![PathBuf::from("/mnt/huge"), PathBuf::from("/mnt/huge1g")]
        }
        fn again() -> Vec<PathBuf> {
            vec![PathBuf::from("/mnt/huge1g"), PathBuf::from("/srv/z")]
        }
        static SHM: BackingPlugin =
            BackingPlugin::new("shm-x", "t", "t", no_build).with_gc_dirs(shm);
        static HUGE: BackingPlugin =
            BackingPlugin::new("huge-x", "t", "t", no_build).with_gc_dirs(huge);
        static AGAIN: BackingPlugin =
            BackingPlugin::new("zz", "t", "t", no_build).with_gc_dirs(again);
        static NONE: BackingPlugin = BackingPlugin::new("anon-x", "t", "t", no_build);
        let dirs = dirs_of(vec![&AGAIN, &SHM, &NONE, &HUGE]);
        let want: Vec<PathBuf> = ["/dev/shm", "/mnt/huge", "/mnt/huge1g", "/srv/z"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(dirs, want);
        assert_eq!(dirs_of(Vec::new()), [PathBuf::from("/dev/shm")]);
    }

    #[test]
    fn the_probe_waits_out_a_concurrent_probe_but_not_a_holder() {
        let dir = std::env::temp_dir().join(format!("hostpool-probe-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hostpool-probe.pool");
        std::fs::write(&path, b"x").unwrap();
        // Another probe holds the file exclusively for an instant: the file is
        // free, and the probe says so.
        let other = std::fs::File::open(&path).unwrap();
        rustix::fs::flock(&other, FlockOperation::LockExclusive).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(1));
            drop(other);
        });
        let mine = std::fs::File::open(&path).unwrap();
        assert!(
            file::try_lock_exclusive(&mine).unwrap(),
            "a brief probe made it look held"
        );
        release.join().unwrap();
        drop(mine);
        // A rank's shared lock: held.
        let rank = std::fs::File::open(&path).unwrap();
        rustix::fs::flock(&rank, FlockOperation::LockShared).unwrap();
        let mine = std::fs::File::open(&path).unwrap();
        assert!(!file::try_lock_exclusive(&mine).unwrap());
        assert!(matches!(locked(&path), Ok(None)));
        drop(rank);
        assert!(matches!(locked(&path), Ok(Some((_, _, 1)))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
