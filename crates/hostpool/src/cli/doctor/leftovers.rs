//! `leftovers`: pool files no live process holds, which `hostpool gc` would
//! remove; judged from `/proc/locks`, without taking locks.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use pool_core::layout::format_bytes;
use pool_core::shared;
use serde_json::json;

use super::Finding;

/// Files that any lock is held on, as `(major, minor, inode)`, from
/// `/proc/locks` (flock, POSIX and OFD locks alike).
fn locked_files() -> io::Result<HashSet<(u32, u32, u64)>> {
    let text = std::fs::read_to_string("/proc/locks")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            line.split_whitespace().find_map(|w| {
                let mut p = w.split(':');
                let (maj, min, ino) = (p.next()?, p.next()?, p.next()?);
                if p.next().is_some() {
                    return None;
                }
                Some((
                    u32::from_str_radix(maj, 16).ok()?,
                    u32::from_str_radix(min, 16).ok()?,
                    ino.parse().ok()?,
                ))
            })
        })
        .collect())
}

/// One pool file and whether a live process holds it.
struct PoolFile {
    path: PathBuf,
    bytes: u64,
    live: bool,
}

/// The pool files in `dirs`, sorted by path, and the dirs that cannot be
/// read.
fn scan(dirs: &[PathBuf], locks: &HashSet<(u32, u32, u64)>) -> (Vec<PoolFile>, Vec<String>) {
    let held = |p: &Path| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| locks.contains(&(libc::major(m.dev()), libc::minor(m.dev()), m.ino())))
    };
    let mut files = Vec::new();
    let mut unreadable = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            unreadable.push(dir.display().to_string());
            continue;
        };
        for e in entries.flatten() {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            // `file_type` does not follow symbolic links: gc never touches them.
            if !e.file_type().is_ok_and(|t| t.is_file()) || !pool_core::gc::is_pool_file(&name) {
                continue;
            }
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ctl_live = !name.ends_with(".ctl")
                && pool_core::gc::pool_name(&name).is_some_and(|n| {
                    [dir.as_path(), Path::new(shared::DEFAULT_CONTROL_DIR)]
                        .iter()
                        .any(|d| held(&shared::ctl_path(d, n)))
                });
            files.push(PoolFile {
                live: held(&path) || ctl_live,
                bytes: meta.len(),
                path,
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    (files, unreadable)
}

/// Stale files listed one per line, at most this many.
const LISTED_STALE: usize = 5;

/// Stale pool files in gc's default dirs and the pool's own `dir`.
pub(super) fn findings(pool_dir: Option<&Path>) -> Vec<Finding> {
    let mut dirs = pool_core::gc::default_dirs();
    if let Some(d) = pool_dir
        && !dirs.iter().any(|x| x == d)
    {
        dirs.push(d.to_path_buf());
    }
    let dir_list = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let locks = match locked_files() {
        Ok(l) => l,
        Err(e) => {
            return vec![
                Finding::new(
                    "leftovers",
                    "pool files",
                    format!("cannot read /proc/locks ({e}): which files are stale is unknown"),
                )
                .info(format!(
                    "`hostpool gc` checks with flock and removes the stale ones in {dir_list}"
                )),
            ];
        }
    };
    let (files, unreadable) = scan(&dirs, &locks);
    let mut out = Vec::new();
    for d in &unreadable {
        if Path::new(d).exists() {
            out.push(
                Finding::new("leftovers", d.clone(), "cannot be read")
                    .info(format!("check the permissions of {d}")),
            );
        }
    }
    let (live, stale): (Vec<&PoolFile>, Vec<&PoolFile>) = files.iter().partition(|f| f.live);
    let live_bytes: u64 = live.iter().map(|f| f.bytes).sum();
    let stale_bytes: u64 = stale.iter().map(|f| f.bytes).sum();
    let live_note = if live.is_empty() {
        String::new()
    } else {
        format!(
            "; {} file(s) of live pools ({})",
            live.len(),
            format_bytes(live_bytes)
        )
    };
    if stale.is_empty() {
        out.push(
            Finding::new(
                "leftovers",
                "pool files",
                format!("no stale file in {dir_list}{live_note}"),
            )
            .details(json!({
                "dirs": dirs,
                "stale": [],
                "live": live.iter().map(|f| &f.path).collect::<Vec<_>>(),
            })),
        );
        return out;
    }
    out.push(
        Finding::new(
            "leftovers",
            "pool files",
            format!(
                "{} stale file(s), {}, held by no process{live_note}",
                stale.len(),
                format_bytes(stale_bytes)
            ),
        )
        .warn("`hostpool gc` removes them (what crashed runs left; live pools are never touched)")
        .details(json!({
            "dirs": dirs,
            "stale": stale
                .iter()
                .map(|f| json!({"path": f.path, "bytes": f.bytes}))
                .collect::<Vec<_>>(),
            "live": live.iter().map(|f| &f.path).collect::<Vec<_>>(),
        })),
    );
    for f in stale.iter().take(LISTED_STALE) {
        out.push(
            Finding::new(
                "leftovers",
                f.path.display().to_string(),
                format!("{}, stale", format_bytes(f.bytes)),
            )
            .warn(format!(
                "`hostpool gc --dir {}`",
                f.path.parent().unwrap_or(Path::new("/")).display()
            )),
        );
    }
    if stale.len() > LISTED_STALE {
        out.push(
            Finding::new(
                "leftovers",
                "…",
                format!("{} more stale file(s)", stale.len() - LISTED_STALE),
            )
            .warn("`hostpool gc`"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_lines_parse() {
        // The real file of this process's namespace parses without error.
        assert!(locked_files().is_ok());
    }
}
