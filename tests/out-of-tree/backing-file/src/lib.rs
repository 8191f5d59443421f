//! `file`: a hostpool backing written out of tree, on `pool-core` alone.
//!
//! The pool is one plain file on any filesystem (ext4, xfs, btrfs, tmpfs…),
//! mapped `MAP_SHARED`: its memory is the file's page cache. It is an example
//! of how a plugin crate that lives outside the hostpool repository adds a
//! backing, not a fast path: for a GPU pool use `hugetlbfs`.
//!
//! ```toml
//! backing = "file"
//! dir = "/var/tmp/kv"        # required: the directory the pool's file goes in
//! size = "8GiB"
//!
//! [file]                     # this plugin's own table; unknown keys are errors
//! name_prefix = "kv-pool"    # optional: keep the file visible while the pool lives
//! ```
//!
//! - **The record.** [`NAME`] is registered with `inventory` at the top level
//!   of this file (through `pool_core::inventory`, so the plugin and
//!   pool-core can never disagree on the inventory version).
//! - **Its own table.** `[file]` is parsed by this crate alone
//!   ([`FileOptions`], `deny_unknown_fields`), through
//!   [`pool_core::plugin::parse_table`], so a typo is an error naming the table.
//! - **The file.** Private by default: created with `O_TMPFILE` or unlinked at
//!   once ([`pool_core::file::create_private`]), so a crash leaves nothing
//!   behind. With `name_prefix` the file stays linked as
//!   `<dir>/<name_prefix>-<pid>-<n>` (mode `0600`, `O_EXCL | O_NOFOLLOW`)
//!   until teardown, which unlinks it by inode. It is sized with `ftruncate`
//!   and mapped with [`pool_core::file::map_files`]; this crate has no
//!   `unsafe` at all.
//! - **Capacity.** Before anything is created the plan checks the free space
//!   of `dir` (`statvfs`: `f_bavail × f_frsize`) and the node's memory (the
//!   pool is meant to stay resident). On tmpfs it makes pool-core's tmpfs
//!   checks (size limit, or memory when there is none, and the cgroup).
//! - **Refusals.** No `dir`, a `dir` that does not exist or is not a
//!   directory, a hugetlbfs `dir` (use backing `hugetlbfs`), a huge
//!   `page_size`, a shared pool, and `numa_node` on a filesystem whose page
//!   cache ignores `mbind` are configuration errors, made before anything is
//!   mapped.

#![forbid(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use pool_core::file::{self, FileId, MapContext, PoolFile};
use pool_core::host::capacity::{self, CapacityCheck};
use pool_core::host::fs::{FsKind, filesystem_kind};
use pool_core::plugin::{
    AutoClaim, AutoQuery, DoctorContext, FilePlan, Finding, MemorySource, parse_table,
};
use pool_core::plugin::{Backing, BackingPlan, BackingPlugin, Mapping};
use pool_core::{Context, Error, PoolConfig, Result};
use pool_core::{Extent, PageSize, format_bytes, round_to_page};
use serde::{Deserialize, Serialize};

/// The plugin name, as `backing = "file"` selects it.
pub const NAME: &str = "file";

/// Prefix of the files hostpool itself creates; `hostpool gc` removes the
/// unlocked ones, so a visible pool file must not look like them.
const RESERVED_PREFIX: &str = "hostpool-";

/// The `[file]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOptions {
    /// Keep the file linked as `<dir>/<name_prefix>-<pid>-<n>` while the
    /// pool lives, so `ls` and `du` show it; teardown unlinks it. Without it
    /// the file is never visible. A process that is killed leaves a visible
    /// file behind: remove it by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,
}

impl FileOptions {
    /// Check the options on their own (the config is checked by the plan).
    ///
    /// # Errors
    /// [`Error::Config`] for a `name_prefix` that is not 1 to 64 letters,
    /// digits, `.`, `_` or `-`, starts with `.`, or starts with `hostpool-`.
    pub fn validate(&self) -> Result<()> {
        let Some(p) = &self.name_prefix else {
            return Ok(());
        };
        if p.is_empty()
            || p.len() > 64
            || p.starts_with('.')
            || !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(Error::config(format!(
                "in table [{NAME}]: name_prefix `{p}` must be 1 to 64 letters, digits, `.`, `_` or \
                 `-`, not starting with `.` (it becomes a file name in dir)"
            )));
        }
        if p.starts_with(RESERVED_PREFIX) {
            return Err(Error::config(format!(
                "in table [{NAME}]: name_prefix `{p}` starts with `{RESERVED_PREFIX}`, which is reserved \
                 for hostpool's own files (`hostpool gc` removes them); pick another prefix"
            )));
        }
        Ok(())
    }
}

/// The configured backing.
#[derive(Debug, Clone, Default)]
pub struct FileBacking {
    options: FileOptions,
}

impl FileBacking {
    /// A backing with these options.
    ///
    /// # Errors
    /// As for [`FileOptions::validate`].
    pub fn new(options: FileOptions) -> Result<FileBacking> {
        options.validate()?;
        Ok(FileBacking { options })
    }
}

/// Parse `[file]` and build the backing; creates nothing.
fn build(table: Option<&serde_json::Value>) -> Result<Box<dyn Backing>> {
    Ok(Box::new(FileBacking::new(parse_table(NAME, table)?)?))
}

pool_core::inventory::submit! {
    BackingPlugin::new(
        NAME,
        "one plain file on any filesystem (dir required; out-of-tree example)",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_auto(claim, &["ext2/3/4", "xfs", "btrfs", "overlayfs"])
    .with_doctor(doctor)
}

/// `hostpool doctor`'s findings for this backing: for a pool that uses it,
/// the filesystem its `dir` is on and the room there (area `file`).
pub fn doctor(ctx: &DoctorContext<'_>) -> Vec<Finding> {
    let Some(config) = ctx
        .config()
        .filter(|c| c.backing == NAME || c.backing == "auto")
    else {
        return Vec::new();
    };
    let Some(dir) = config.dir.as_deref() else {
        return vec![
            Finding::new("file", "dir", "not given")
                .fail("backing file needs dir, the directory its file goes in"),
        ];
    };
    let item = dir.display().to_string();
    let finding = match (filesystem_kind(dir), pool_core::host::fs::free_space(dir)) {
        (Ok(kind), Ok(free)) => {
            let f = Finding::new(
                "file",
                item,
                format!("{}, {} free", fs_name(kind), format_bytes(free)),
            );
            if free < config.size.get() {
                f.fail("free space there, or point dir at a filesystem with room (`df -h`)")
            } else {
                f
            }
        }
        (Err(e), _) | (_, Err(e)) => Finding::new("file", item, format!("cannot be examined: {e}"))
            .fail("create the directory, or point dir at an existing one"),
    };
    vec![finding]
}

/// Under `backing = "auto"`, this backing serves a directory on a disk
/// filesystem (ext4, xfs, btrfs, overlayfs) that no built-in backing takes,
/// with a low priority so a built-in claim always wins.
fn claim(q: &AutoQuery<'_>) -> Option<AutoClaim> {
    let dir = q.dir?;
    let FsKind::Other { magic } = dir.fs.kind() else {
        return None;
    };
    DISK_FILESYSTEMS.contains(&magic).then(|| {
        AutoClaim::new(
            1,
            format!(
                "{} is on {}: one plain file (the out-of-tree `file` backing)",
                dir.path.display(),
                fs_name(dir.fs.kind())
            ),
        )
    })
}

/// ext2/3/4, xfs, btrfs, overlayfs (`include/uapi/linux/magic.h`).
const DISK_FILESYSTEMS: [u64; 4] = [0xef53, 0x5846_5342, 0x9123_683e, 0x794c_7630];

/// A readable name for a filesystem magic number.
fn fs_name(kind: FsKind) -> String {
    match kind {
        FsKind::Tmpfs => "tmpfs".into(),
        FsKind::Hugetlbfs { .. } => "hugetlbfs".into(),
        FsKind::Other { magic } => match magic {
            0xef53 => "ext2/3/4".into(),
            0x5846_5342 => "xfs".into(),
            0x9123_683e => "btrfs".into(),
            0x0102_1994 => "tmpfs".into(),
            0x794c_7630 => "overlayfs".into(),
            _ => format!("filesystem magic {magic:#x}"),
        },
    }
}

/// Judge `dir` from what the system said about it: `is_dir` from `stat`,
/// `kind` from `statfs`. Pure, so every refusal is tested on any host.
fn judge_dir(dir: &Path, is_dir: io::Result<bool>, kind: io::Result<FsKind>) -> Result<FsKind> {
    let d = dir.display();
    match is_dir {
        Ok(true) => {}
        Ok(false) => {
            return Err(Error::config(format!(
                "dir {d} is not a directory; point dir at the directory the pool's file should go in"
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::config(format!(
                "dir {d} does not exist; create it (`mkdir -p {d}`) or point dir at an existing \
                 scratch directory"
            )));
        }
        Err(e) => {
            return Err(Error::on_input_path(
                "stat",
                dir,
                e,
                format!("dir {d} cannot be examined"),
                "check its path and permissions",
            ));
        }
    }
    match kind {
        Ok(FsKind::Hugetlbfs { page_size }) => Err(Error::config(format!(
            "dir {d} is a hugetlbfs mount with {} pages: backing {NAME} makes plain files of \
             ordinary pages; use backing = \"hugetlbfs\" with this dir, which sizes the pool in \
             huge pages and checks the reserved pool",
            format_bytes(page_size)
        ))),
        Ok(kind) => Ok(kind),
        Err(e) => Err(Error::on_input_path(
            "statfs",
            dir,
            e,
            format!("dir {d} cannot be examined"),
            "check its path and permissions",
        )),
    }
}

/// The pool's directory and its filesystem.
fn resolve_dir(dir: Option<&Path>) -> Result<(PathBuf, FsKind)> {
    let Some(dir) = dir else {
        return Err(Error::config(format!(
            "backing {NAME} needs dir, the directory its file goes in (for example dir = \
             \"/var/tmp/hostpool\" on ext4 or xfs); for a pool without a file use backing anon"
        )));
    };
    let kind = judge_dir(
        dir,
        std::fs::metadata(dir).map(|m| m.is_dir()),
        filesystem_kind(dir),
    )?;
    Ok((dir.to_path_buf(), kind))
}

/// Bytes free in `dir` for unprivileged writers (`statvfs`), or `None` when
/// `statvfs` fails.
fn statvfs_free(dir: &Path) -> Option<u64> {
    pool_core::host::fs::free_space(dir).ok()
}

/// The space check for a pool of `need` bytes on the filesystem `fs` of `dir`.
fn space_check(need: u64, dir: &Path, fs: &str, free: Option<u64>) -> CapacityCheck {
    let d = dir.display();
    let remedy = match free {
        Some(_) => format!(
            "the pool's file takes its whole size on {d} once prefaulted: free space there (`du -sh \
             {d}/*`), point dir at a filesystem with room (`df -h`), or ask for a smaller --size"
        ),
        None => format!("cannot statvfs {d}; check that it exists and is readable"),
    };
    CapacityCheck::new(
        &format!("file system space ({fs})"),
        &format!("statvfs({d}) f_bavail"),
        need,
        free,
        &remedy,
    )
}

/// Every capacity check for a pool of `need` bytes in `dir`.
fn capacity_checks(need: u64, dir: &Path, kind: FsKind) -> Vec<CapacityCheck> {
    let mut checks = vec![space_check(need, dir, &fs_name(kind), statvfs_free(dir))];
    // The pool is page cache that is meant to stay resident (prefaulted,
    // then pinned): the node must hold it too.
    checks.extend(capacity::ordinary_memory(need));
    checks
}

/// Tells apart the visible files of one process.
static SERIAL: AtomicU64 = AtomicU64::new(0);

fn os_error(
    op: &'static str,
    path: &Path,
    size: u64,
    page: PageSize,
    remedy: &str,
    source: io::Error,
) -> Error {
    Error::os(
        op,
        source,
        Context::new(size, page).path(path).remedy(remedy),
    )
}

/// Create the visible pool file at `path` (`0600`, `O_EXCL | O_NOFOLLOW`)
/// and size it; on failure, nothing is left at `path`.
fn create_visible(path: &Path, len: u64, page: PageSize) -> Result<(OwnedFd, FileId)> {
    let fd = file::create_exclusive(path).map_err(|e| {
        os_error(
            "open(O_CREAT|O_EXCL|O_NOFOLLOW)",
            path,
            len,
            page,
            "check that dir is writable; a file of that name (left by a killed process?) must be removed by hand",
            e,
        )
    })?;
    let id = match file::file_id(&fd) {
        Ok(id) => id,
        Err(e) => {
            let _ = std::fs::remove_file(path);
            return Err(os_error(
                "fstat",
                path,
                len,
                page,
                "the new file vanished",
                e,
            ));
        }
    };
    let f = std::fs::File::from(fd);
    if let Err(e) = f.set_len(len) {
        let _ = file::unlink_if_same(path, id);
        return Err(os_error(
            "ftruncate",
            path,
            len,
            page,
            "the filesystem refused the size; check its maximum file size and free space",
            e,
        ));
    }
    Ok((OwnedFd::from(f), id))
}

impl Backing for FileBacking {
    fn name(&self) -> &'static str {
        NAME
    }

    fn plan(&self, config: &PoolConfig) -> Result<BackingPlan> {
        let (dir, kind) = resolve_dir(config.dir.as_deref())?;
        let fs = fs_name(kind);
        if config.sharing.is_some() {
            return Err(Error::config(format!(
                "backing {NAME} makes private pools only; for a pool shared by the ranks of an engine \
                 use backing shm-segmented (tmpfs) or hugetlbfs"
            )));
        }
        let base = PageSize::new(pool_core::base_page_size() as u64)?;
        if let Some(asked) = config.page_size
            && asked.get() != base.get()
        {
            return Err(Error::config(format!(
                "backing {NAME} maps {base} base pages, not the {} page_size asked for; for huge \
                 pages use backing hugetlbfs",
                format_bytes(asked.get())
            )));
        }
        if let (Some(node), false) = (&config.numa_node, kind == FsKind::Tmpfs) {
            return Err(Error::config(format!(
                "numa_node = {node} cannot be honoured on {} ({fs}): the page cache of a regular \
                 file follows the process's memory policy, not mbind on the mapping; drop numa_node \
                 and start the process under `numactl --membind=NODE`, or use a tmpfs dir",
                dir.display()
            )));
        }
        let size = round_to_page(config.size.get(), base)?;
        let files = match &self.options.name_prefix {
            Some(prefix) => vec![dir.join(format!(
                "{prefix}-{}-{}",
                std::process::id(),
                SERIAL.fetch_add(1, Ordering::Relaxed)
            ))],
            None => Vec::new(),
        };
        let mut explain = vec![
            match files.first() {
                Some(path) => format!(
                    "one file on {fs} in {}, visible as {} while the pool lives and unlinked at teardown",
                    dir.display(),
                    path.display()
                ),
                None => format!(
                    "one private file on {fs} in {} (O_TMPFILE, or unlinked at once: never visible)",
                    dir.display()
                ),
            },
            format!(
                "{} asked, {} mapped in {base} pages, MAP_SHARED: the pool is the file's page cache",
                format_bytes(size.logical()),
                format_bytes(size.mapped())
            ),
        ];
        if kind != FsKind::Tmpfs {
            explain.push(format!(
                "{fs} may write the pages back to disk and reclaim them under memory pressure; \
                 pin the pool to keep it resident"
            ));
        }
        // `BackingPlan` is `#[non_exhaustive]`: built with `new` and its
        // fields, so a field pool-core adds later breaks nothing here.
        let mut plan = BackingPlan::new(NAME, size);
        plan.capacity = capacity_checks(size.mapped(), &dir, kind);
        plan.options = serde_json::json!({
            "dir": dir.display().to_string(),
            "filesystem": fs,
            "name_prefix": self.options.name_prefix,
            "path": files.first().map(|p| p.display().to_string()),
        });
        plan.explain = explain;
        let enomem = format!(
            "the kernel could not map {} (address space, or vm.max_map_count); ask for a \
             smaller --size",
            format_bytes(size.mapped())
        );
        if files.is_empty() {
            // A private file: the core makes and maps it with our function.
            let page = size.page();
            let (create_dir, check_dir) = (dir.clone(), dir.clone());
            let mapped = size.mapped();
            plan.source = MemorySource::Files(FilePlan::new(
                vec![Extent {
                    offset: 0,
                    len: size.mapped(),
                }],
                move |e| file::create_private(&create_dir, e.len, page),
                move || capacity_checks(mapped, &check_dir, kind),
                enomem,
            ));
        }
        // A visible file is this backing's own: `map` makes it.
        plan.files = files;
        Ok(plan)
    }

    fn map(&self, plan: &BackingPlan) -> Result<Box<dyn Mapping>> {
        let page = plan.size.page();
        let len = plan.size.mapped();
        let Some(path) = plan.files.first() else {
            return Err(Error::Plugin {
                what: NAME.into(),
                message: "a private file is the core's to map".into(),
                source: None,
            });
        };
        let (fd, id) = create_visible(path, len, page)?;
        let (fd, id, path) = (fd, id, Some(path.clone()));
        // On error map_files unmaps, closes and unlinks (by inode) what it
        // was given, so nothing is left behind.
        let mapping = file::map_files(
            vec![PoolFile {
                fd,
                path,
                id,
                extent: Extent { offset: 0, len },
            }],
            plan.size,
            &MapContext {
                enomem_remedy: format!(
                    "the kernel could not map {} (address space, or vm.max_map_count); ask for a \
                     smaller --size",
                    format_bytes(len)
                ),
                ..MapContext::default()
            },
        )?;
        Ok(Box::new(mapping))
    }
}

#[cfg(test)]
mod tests {
    use pool_core::host::capacity::Verdict;
    use pool_core::plugin::{lookup, names};
    use pool_core::{ByteSize, Pool, PoolPlan, Quiet};
    use serde_json::json;

    use super::*;

    /// A scratch directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!(
                "file-backing-unit-{tag}-{}-{}",
                std::process::id(),
                SERIAL.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        fn entries(&self) -> Vec<PathBuf> {
            std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn config(dir: &Path, size: u64, table: Option<serde_json::Value>) -> PoolConfig {
        let mut c = PoolConfig {
            size: ByteSize(size),
            backing: NAME.into(),
            dir: Some(dir.to_path_buf()),
            ..PoolConfig::default()
        };
        if let Some(t) = table {
            c.plugins.insert(NAME.into(), t);
        }
        c
    }

    #[test]
    fn this_crate_registers_exactly_the_file_backing() {
        // The unit-test binary is this crate, so its record is linked: the
        // exact set, not just "contains", catches a record that goes missing
        // or a second one that sneaks in.
        assert_eq!(names::<BackingPlugin>().unwrap(), [NAME]);
        let record = lookup::<BackingPlugin>(NAME).unwrap();
        assert_eq!(record.origin, "hostpool-example-backing-file");
    }

    #[test]
    fn the_table_rejects_unknown_keys_and_bad_prefixes() {
        let e = build(Some(&json!({"name_prefx": "kv"}))).unwrap_err();
        assert!(
            e.to_string().contains("[file]") && e.to_string().contains("name_prefx"),
            "{e}"
        );
        assert!(build(None).is_ok());
        assert!(build(Some(&json!({"name_prefix": "kv-pool.0"}))).is_ok());
        for bad in ["", ".hidden", "a/b", "../x", "sp ace", &"x".repeat(65)] {
            let e = build(Some(&json!({ "name_prefix": bad }))).unwrap_err();
            assert!(e.to_string().contains("must be 1 to 64"), "{bad:?}: {e}");
        }
        let e = build(Some(&json!({"name_prefix": "hostpool-kv"}))).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn dir_refusals_name_the_dir_and_the_fix() {
        let d = Path::new("/scratch/kv");
        let gone = || io::Error::from(io::ErrorKind::NotFound);
        let msg = |r: Result<FsKind>| r.unwrap_err().to_string();
        let m = msg(judge_dir(d, Err(gone()), Err(gone())));
        assert!(
            m.contains("/scratch/kv does not exist") && m.contains("mkdir -p /scratch/kv"),
            "{m}"
        );
        let m = msg(judge_dir(d, Ok(false), Ok(FsKind::Other { magic: 0xef53 })));
        assert!(m.contains("is not a directory"), "{m}");
        let m = msg(judge_dir(
            d,
            Ok(true),
            Ok(FsKind::Hugetlbfs { page_size: 1 << 30 }),
        ));
        assert!(
            m.contains("hugetlbfs mount with 1 GiB pages")
                && m.contains("use backing = \"hugetlbfs\""),
            "{m}"
        );
        assert_eq!(
            judge_dir(d, Ok(true), Ok(FsKind::Tmpfs)).unwrap(),
            FsKind::Tmpfs
        );
        let ext4 = FsKind::Other { magic: 0xef53 };
        assert_eq!(judge_dir(d, Ok(true), Ok(ext4)).unwrap(), ext4);
        assert_eq!(fs_name(ext4), "ext2/3/4");
        let e = resolve_dir(None).unwrap_err();
        assert!(e.to_string().contains("backing file needs dir"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn a_short_filesystem_is_refused_with_a_concrete_remedy() {
        let d = Path::new("/scratch/kv");
        let c = space_check(8 << 30, d, "xfs", Some(1 << 30));
        assert_eq!(c.verdict, Verdict::Short);
        let m = c.to_error().unwrap().to_string();
        for want in [
            "file system space (xfs)",
            "statvfs(/scratch/kv)",
            "needs 8 GiB, 1 GiB free",
            "du -sh /scratch/kv/*",
            "df -h",
            "smaller --size",
        ] {
            assert!(m.contains(want), "missing {want:?} in {m}");
        }
        assert_eq!(space_check(1, d, "xfs", None).verdict, Verdict::Unknown);
        assert_eq!(
            space_check(1 << 30, d, "xfs", Some(1 << 30)).verdict,
            Verdict::Fits
        );
    }

    #[test]
    fn the_plan_checks_the_real_free_space_of_dir() {
        let s = Scratch::new("plan");
        let plan = PoolPlan::new(config(&s.0, 4 << 20, None)).unwrap();
        let bp = plan.backing_plan().unwrap();
        assert_eq!(bp.backing, NAME);
        assert!(bp.files.is_empty());
        let kind = filesystem_kind(&s.0).unwrap();
        if kind == FsKind::Tmpfs {
            eprintln!("note: the temp dir is tmpfs; pool-core's tmpfs checks apply");
        } else {
            let space = &bp.capacity[0];
            assert!(space.resource.starts_with("file system space"), "{space:?}");
            assert_eq!(space.verdict, Verdict::Fits, "{space:?}");
            assert!(space.free.unwrap() > 0);
            assert!(
                bp.capacity
                    .iter()
                    .any(|c| c.source.contains("MemAvailable")),
                "{:?}",
                bp.capacity
            );
        }
        assert_eq!(bp.options["filesystem"], json!(fs_name(kind)));
        assert!(s.entries().is_empty(), "planning must create nothing");
    }

    #[test]
    fn a_private_file_is_never_visible_and_a_named_one_only_while_the_pool_lives() {
        let s = Scratch::new("vis");
        let pool =
            Pool::build(&PoolPlan::new(config(&s.0, 1 << 20, None)).unwrap(), &Quiet).unwrap();
        assert!(s.entries().is_empty(), "{:?}", s.entries());
        assert!(pool.teardown().teardown_issues.is_empty());

        let pool = Pool::build(
            &PoolPlan::new(config(&s.0, 1 << 20, Some(json!({"name_prefix": "kv"})))).unwrap(),
            &Quiet,
        )
        .unwrap();
        let files = s.entries();
        assert_eq!(files.len(), 1, "{files:?}");
        let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(&format!("kv-{}-", std::process::id())),
            "{name}"
        );
        assert_eq!(pool.files(), files);
        let meta = std::fs::metadata(&files[0]).unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o600
        );
        assert_eq!(
            pool.report().options["path"],
            json!(files[0].display().to_string())
        );
        assert!(pool.teardown().teardown_issues.is_empty());
        assert!(s.entries().is_empty(), "teardown must unlink the file");
    }

    #[test]
    fn a_file_in_the_way_of_a_visible_pool_is_an_error_and_is_left_alone() {
        let s = Scratch::new("busy");
        let plan =
            PoolPlan::new(config(&s.0, 1 << 20, Some(json!({"name_prefix": "kv"})))).unwrap();
        let path = plan.backing_plan().unwrap().files[0].clone();
        std::fs::write(&path, b"someone else's").unwrap();
        let e = Pool::build(&plan, &Quiet).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("O_EXCL") && m.contains(&path.display().to_string()),
            "{m}"
        );
        assert_eq!(e.errno(), Some(17), "EEXIST");
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
    }
}
