//! A kept pool's files in a directory that outlives processes
//! (`persist = "DIR"`): a hugetlbfs or tmpfs mount, e.g. a Kubernetes
//! hostPath. The keeper makes them there once, under names of its own
//! (`hostpool.kept.<pool>.<i>`, 0600), and never removes them: a keeper
//! started again with the same config opens and maps them, bytes and index,
//! after checking each (a regular file, not a link: none is followed; owned
//! by the keeper's user, 0600; exactly its extent's length). Anything else
//! found there under those names is refused, naming it, and nothing of it
//! is mapped. Removing them is an explicit act ([`forget`],
//! `hostpool keep forget`), which `hostpool gc` never does.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use pool_core::{Error, Extent, Result};

/// The prefix of every persisted file's name: not `gc`'s (`hostpool-`),
/// so that no `gc` ever takes a persisted file for a crashed run's.
pub const PREFIX: &str = "hostpool.kept.";

/// The name of pool `pool`'s file `i` in its persist directory.
pub fn file_name(pool: &str, i: usize) -> String {
    format!("{PREFIX}{pool}.{i}")
}

/// A pool's files in its persist directory: found (a keeper ran before)
/// or made now.
#[derive(Debug)]
pub struct Files {
    /// One per extent, in pool order.
    pub fds: Vec<OwnedFd>,
    /// Their paths.
    pub paths: Vec<PathBuf>,
    /// Whether they were there already (else made now, empty).
    pub found: bool,
}

impl Files {
    /// Remove files made now (a build that failed leaves nothing behind).
    pub fn remove_made(&self) {
        if !self.found {
            remove(&self.paths);
        }
    }
}

/// Remove the files at `paths` (made by [`open_or_make`] for a build that
/// then failed).
pub fn remove(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

fn refused(path: &Path, message: String) -> Error {
    Error::Conflict {
        path: path.to_path_buf(),
        message,
    }
}

/// Check that `dir` may hold a keeper's files: a directory (not a link),
/// owned by this user, writable by no one else.
fn check_dir(dir: &Path) -> Result<()> {
    let st = rustix::fs::lstat(dir).map_err(|e| {
        Error::on_input_path(
            "lstat",
            dir,
            std::io::Error::from(e),
            format!("the persist directory {} cannot be read", dir.display()),
            "create it on a hugetlbfs or tmpfs mount that outlives the keeper (mkdir -m 0700)",
        )
    })?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::Directory {
        return Err(refused(
            dir,
            format!(
                "the persist directory {} is not a directory ({kind:?}); a link is not followed: \
                 name the directory itself",
                dir.display()
            ),
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(refused(
            dir,
            format!(
                "the persist directory {} is owned by uid {}, not by the keeper's uid {me}: \
                 another user could plant files there; chown it to the keeper's user",
                dir.display(),
                st.st_uid
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(refused(
            dir,
            format!(
                "the persist directory {} is writable by other users (mode {:o}): they could plant \
                 files there; chmod go-w it",
                dir.display(),
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Open pool `pool`'s files in `dir`, one per extent of `extents`, or make
/// them when none is there.
///
/// # Errors
/// [`Error::Conflict`] naming the first file that is not the pool's (a
/// link, another user's, another mode, another length, a part of the set
/// missing) or a directory that may not hold them; nothing is mapped, and
/// nothing found is changed.
pub fn open_or_make(dir: &Path, pool: &str, extents: &[Extent]) -> Result<Files> {
    check_dir(dir)?;
    let paths: Vec<PathBuf> = (0..extents.len())
        .map(|i| dir.join(file_name(pool, i)))
        .collect();
    let exist: Vec<bool> = paths.iter().map(|p| rustix::fs::lstat(p).is_ok()).collect();
    // A file of an index beyond this plan's: the pool was persisted with
    // another layout.
    let beyond = dir.join(file_name(pool, extents.len()));
    if rustix::fs::lstat(&beyond).is_ok() {
        return Err(refused(
            &beyond,
            format!(
                "{} is there, beyond the {} file(s) this config plans for kept pool `{pool}`: it \
                 was persisted with another size or layout; start the keeper with the config it \
                 ran with, or throw the persisted pool away (hostpool keep forget --name {pool} \
                 --persist {})",
                beyond.display(),
                extents.len(),
                dir.display()
            ),
        ));
    }
    if exist.iter().all(|e| !e) {
        return make(dir, pool, &paths, extents);
    }
    if let Some(i) = exist.iter().position(|e| !e) {
        return Err(refused(
            &paths[i],
            format!(
                "{} is missing from kept pool `{pool}`'s persisted files in {}: the set is \
                 incomplete (a keeper died while making it, or a file was removed); throw it away \
                 (hostpool keep forget --name {pool} --persist {}) to build afresh",
                paths[i].display(),
                dir.display(),
                dir.display()
            ),
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    let mut fds = Vec::with_capacity(paths.len());
    for (path, extent) in paths.iter().zip(extents) {
        let fd = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| {
            let why = if e == rustix::io::Errno::LOOP {
                "is a symbolic link, which is never followed".to_string()
            } else {
                format!("cannot be opened ({e})")
            };
            refused(
                path,
                format!(
                    "{} {why}: nothing of it was mapped; remove it, or throw the persisted pool \
                     away (hostpool keep forget --name {pool} --persist {})",
                    path.display(),
                    dir.display()
                ),
            )
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| {
            Error::on_input_path(
                "fstat",
                path,
                std::io::Error::from(e),
                format!("{} cannot be read", path.display()),
                "check the persist directory's filesystem",
            )
        })?;
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        let wrong = if kind != rustix::fs::FileType::RegularFile {
            Some(format!("is not a regular file ({kind:?})"))
        } else if st.st_uid != me {
            Some(format!(
                "is owned by uid {}, not the keeper's {me}",
                st.st_uid
            ))
        } else if st.st_mode & 0o077 != 0 {
            Some(format!(
                "has mode {:o}: a keeper's files are 0600",
                st.st_mode & 0o7777
            ))
        } else if u64::try_from(st.st_size).unwrap_or(0) != extent.len {
            Some(format!(
                "is {} long, its extent {}",
                pool_core::format_bytes(u64::try_from(st.st_size).unwrap_or(0)),
                pool_core::format_bytes(extent.len)
            ))
        } else {
            None
        };
        if let Some(wrong) = wrong {
            return Err(refused(
                path,
                format!(
                    "{} {wrong}: it is not kept pool `{pool}`'s file as this keeper made it, and \
                     nothing of it was mapped; start the keeper with the config it ran with, or \
                     throw the persisted pool away (hostpool keep forget --name {pool} --persist \
                     {})",
                    path.display(),
                    dir.display()
                ),
            ));
        }
        // The file is what it was opened as from here on: the nonblocking
        // open only kept a FIFO from blocking.
        let _ = rustix::fs::fcntl_setfl(&fd, OFlags::empty());
        fds.push(fd);
    }
    Ok(Files {
        fds,
        paths,
        found: true,
    })
}

/// Make pool `pool`'s files at `paths`, 0600, each its extent's length;
/// what was made is removed again on error.
fn make(dir: &Path, pool: &str, paths: &[PathBuf], extents: &[Extent]) -> Result<Files> {
    let mut files = Files {
        fds: Vec::new(),
        paths: Vec::new(),
        found: false,
    };
    for (path, extent) in paths.iter().zip(extents) {
        let made = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .and_then(|fd| {
            rustix::fs::ftruncate(&fd, extent.len)?;
            Ok(fd)
        });
        match made {
            Ok(fd) => {
                files.paths.push(path.clone());
                files.fds.push(fd);
            }
            Err(e) => {
                files.remove_made();
                return Err(Error::on_input_path(
                    "open(O_CREAT|O_EXCL)",
                    path,
                    std::io::Error::from(e),
                    format!(
                        "kept pool `{pool}`'s file {} of {} cannot be made in {}",
                        path.display(),
                        pool_core::format_bytes(extent.len),
                        dir.display()
                    ),
                    "the persist directory must be on a hugetlbfs or tmpfs mount with room for \
                     the pool (for hugetlbfs: huge pages of the pool's size reserved)",
                ));
            }
        }
    }
    Ok(files)
}

/// Remove pool `pool`'s persisted files from `dir` (every
/// `hostpool.kept.<pool>.<i>`, links and planted files included, none
/// followed): the persisted pool thrown away on purpose. The paths
/// removed.
///
/// # Errors
/// A directory that cannot be read, or a file that cannot be removed.
pub fn forget(dir: &Path, pool: &str) -> Result<Vec<PathBuf>> {
    pool_core::check_name("kept pool", pool)?;
    let prefix = format!("{PREFIX}{pool}.");
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Error::on_input_path(
            "read_dir",
            dir,
            e,
            format!("the persist directory {} cannot be read", dir.display()),
            "give the directory the keeper's persist names",
        )
    })?;
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        if rest.parse::<usize>().is_err() {
            continue;
        }
        let path = entry.path();
        std::fs::remove_file(&path).map_err(|e| {
            Error::on_input_path(
                "unlink",
                &path,
                e,
                format!("{} cannot be removed", path.display()),
                "check the directory's permissions",
            )
        })?;
        removed.push(path);
    }
    removed.sort();
    Ok(removed)
}

/// A descriptor of each of `files`, borrowed.
pub fn borrowed(files: &Files) -> Vec<std::os::fd::BorrowedFd<'_>> {
    files.fds.iter().map(AsFd::as_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hostpool-persist-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        d
    }

    fn extents(n: u64) -> Vec<Extent> {
        (0..n)
            .map(|i| Extent {
                offset: i * 8192,
                len: 8192,
            })
            .collect()
    }

    #[test]
    fn files_are_made_once_then_found_and_forgotten_on_purpose() {
        let d = dir("made");
        let made = open_or_make(&d, "kv", &extents(2)).unwrap();
        assert!(!made.found && made.fds.len() == 2);
        let ids: Vec<_> = made
            .fds
            .iter()
            .map(|f| pool_core::file::file_id(f).unwrap())
            .collect();
        drop(made);
        let found = open_or_make(&d, "kv", &extents(2)).unwrap();
        assert!(found.found);
        let again: Vec<_> = found
            .fds
            .iter()
            .map(|f| pool_core::file::file_id(f).unwrap())
            .collect();
        assert_eq!(ids, again);
        let mode = std::fs::metadata(&found.paths[0]).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        // Another layout is refused, naming the file beyond it or the size.
        let e = open_or_make(&d, "kv", &extents(1)).unwrap_err().to_string();
        assert!(
            e.contains("hostpool.kept.kv.1") && e.contains("another size or layout"),
            "{e}"
        );
        // gc never takes a persisted file for a crashed run's, whatever the
        // pool's name.
        for name in ["kv", "a.pool", "x.ctl"] {
            assert!(!pool_core::gc::is_pool_file(&file_name(name, 3)), "{name}");
        }
        let forgotten = forget(&d, "kv").unwrap();
        assert_eq!(forgotten.len(), 2);
        assert!(std::fs::read_dir(&d).unwrap().next().is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_planted_file_a_link_another_mode_or_size_is_refused_naming_it() {
        let d = dir("planted");
        let path = d.join(file_name("kv", 0));
        let check = |what: &str| {
            let e = open_or_make(&d, "kv", &extents(1)).unwrap_err().to_string();
            assert!(
                e.contains(&path.display().to_string()) && e.contains(what),
                "{e}"
            );
        };
        // A link to a file elsewhere: never followed.
        let target = d.join("elsewhere");
        std::fs::write(&target, vec![0u8; 8192]).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        check("symbolic link");
        std::fs::remove_file(&path).unwrap();
        // Planted with another mode, then another size.
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        check("has mode 644");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        check("4 KiB long");
        std::fs::remove_file(&path).unwrap();
        // A FIFO: not a regular file (and the open does not block on it).
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        check("not a regular file");
        std::fs::remove_file(&path).unwrap();
        // Another user's file (as root: chown it away).
        if rustix::process::geteuid().is_root() {
            std::fs::write(&path, vec![0u8; 8192]).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            check("owned by uid 65534");
        }
        // A directory others may write to.
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = open_or_make(&d, "kv", &extents(1)).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
