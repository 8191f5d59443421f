//! `leftovers`: pool files no live process holds, which `hostpool gc` would
//! remove; judged by gc's own lock probe (which sees holders in other PID
//! namespaces, unlike `/proc/locks`), removing nothing.

use std::path::{Path, PathBuf};

use pool_core::format_bytes;
use pool_core::gc::Liveness;
use serde_json::json;

use super::Finding;

/// One pool file and whether a live process holds it.
struct PoolFile {
    path: PathBuf,
    bytes: u64,
    live: bool,
}

/// The pool files in `dirs`, sorted by path, and the dirs that cannot be
/// read, judged by gc's own lock probe ([`pool_core::gc::scan`]).
fn scan(dirs: &[PathBuf]) -> (Vec<PoolFile>, Vec<String>) {
    let found = pool_core::gc::scan(dirs);
    let mut files: Vec<PoolFile> = found
        .files
        .into_iter()
        .map(|f| PoolFile {
            live: !matches!(f.liveness, Liveness::Stale { .. }),
            bytes: f.bytes,
            path: f.path,
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let unreadable = found
        .unreadable
        .iter()
        .map(|d| d.display().to_string())
        .collect();
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
    let (files, unreadable) = scan(&dirs);
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
