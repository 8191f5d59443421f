//! hugetlbfs mounts, done with the `mount`/`umount` commands.

use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::Duration;

use crate::cmd::run_tool;
use crate::hugepages::PageSize;

/// How often a busy mount is retried before falling back to `umount -l`.
const UMOUNT_ATTEMPTS: u32 = 4;
/// Pause between unmount attempts (lets dying test processes close files).
const UMOUNT_RETRY_DELAY: Duration = Duration::from_millis(250);

/// How a mount point was removed.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Plain `umount` succeeded.
    Cleanly,
    /// The mount was busy; it was detached with `umount -l` and disappears
    /// once the last user closes it (its pages stay in use until then).
    Lazily,
}

/// Mounts hugetlbfs with pages of `size` at the existing directory `at`.
pub fn mount_hugetlbfs(size: PageSize, at: &Path) -> Result<(), String> {
    let options = format!("pagesize={},mode=0700", size.tag());
    let target = path_str(at)?;
    run_tool(
        "mount",
        &["-t", "hugetlbfs", "-o", &options, "none", target],
    )
    .map_err(|err| {
        format!(
            "could not mount hugetlbfs ({} pages) at {target}: {err}; \
             mounting needs root/CAP_SYS_ADMIN and a kernel with CONFIG_HUGETLBFS",
            size.human()
        )
    })
}

/// Unmounts `at`, retrying while busy and finally detaching it lazily.
pub fn unmount(at: &Path) -> Result<Unmounted, String> {
    let target = path_str(at)?;
    let mut last_error = String::new();
    for attempt in 1..=UMOUNT_ATTEMPTS {
        match run_tool("umount", &[target]) {
            Ok(()) => return Ok(Unmounted::Cleanly),
            Err(err) => last_error = err,
        }
        if attempt < UMOUNT_ATTEMPTS {
            sleep(UMOUNT_RETRY_DELAY);
        }
    }
    eprintln!("xtask: warning: {last_error}; retrying with `umount -l`");
    run_tool("umount", &["-l", target])
        .map(|()| Unmounted::Lazily)
        .map_err(|err| format!("could not unmount {target}: {err}; check `fuser -vm {target}`"))
}

/// Mount points at or below `dir`, deepest first (the unmount order).
pub fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let table = pool_core::host::fs::mounts()
        .map_err(|err| format!("could not read /proc/mounts: {err}"))?;
    let mut found: Vec<PathBuf> = table
        .into_iter()
        .map(|m| m.point)
        .filter(|point| point.starts_with(dir))
        .collect();
    found.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    found.dedup();
    Ok(found)
}

/// `path` as UTF-8, which the `mount` command line needs.
fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("path {} is not valid UTF-8", path.display()))
}
