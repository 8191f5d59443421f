//! `hugetlbfs`: reserved huge pages (2 MiB or 1 GiB), the fast path for a
//! GPU pool. With 1 GiB pages a 450 GiB pool is 450 pages, so pinning and
//! registration tables become trivial, and prefault runs at memory bandwidth.
//!
//! - With `dir`, the pool is one file on a hugetlbfs mount (checked with
//!   `statfs`, magic `0x958458f6`); the mount's `f_bsize` is the page size,
//!   and a `page_size` that differs is an error. Huge-page files cannot be
//!   stitched from segments at arbitrary offsets, so it is always one file.
//! - Without `dir`, the pool is a `memfd_create(MFD_HUGETLB | size flag)` of
//!   `page_size` (default: the kernel's default huge page size): no mount needed.
//! - The mapping is `MAP_SHARED` without `MAP_NORESERVE`, so a shortage of
//!   huge pages fails at `mmap` with `ENOMEM`, which becomes one clear error;
//!   capacity is checked first against sysfs (free − reserved for that size,
//!   per NUMA node when asked), the mount's `size=` limit and the hugetlb
//!   cgroup limit. Never against `MemAvailable`. A pool never dies of SIGBUS.
//!
//! ```toml
//! backing = "hugetlbfs"
//! dir = "/dev/hugepages-1Gi"   # or omit dir and set page_size = "1GiB" for a memfd
//! ```

#![forbid(unsafe_code)]

mod doctor;

use std::path::{Path, PathBuf};

use pool_core::file;
use pool_core::host::fs::{FsKind, filesystem_kind};
use pool_core::plugin::{AutoClaim, AutoQuery, FilePlan, MemorySource, PrefaultCost, parse_table};
use pool_core::plugin::{Backing, BackingPlan, BackingPlugin};
use pool_core::{Error, PoolConfig, Result};
use pool_core::{Extent, PageSize, format_bytes, round_to_page};

pub mod host;
use host as hugetlb;
use serde::{Deserialize, Serialize};

/// The plugin name.
pub const NAME: &str = "hugetlbfs";

/// The `[hugetlbfs]` table (no keys yet; unknown ones are errors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HugetlbfsOptions {}

/// The configured backing.
#[derive(Debug, Clone, Copy, Default)]
pub struct HugetlbfsBacking;

fn build(table: Option<&serde_json::Value>) -> Result<Box<dyn Backing>> {
    let _: HugetlbfsOptions = parse_table(NAME, table)?;
    Ok(Box::new(HugetlbfsBacking))
}

inventory::submit! {
    BackingPlugin::new(
        NAME,
        "reserved huge pages: one file on a hugetlbfs mount (dir), or a memfd (MFD_HUGETLB) without one",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_auto(claim, &["hugetlbfs"])
    .with_cost(PrefaultCost::DEFAULT)
    .with_doctor(doctor::findings)
    .with_gc_dirs(gc_dirs)
}

/// Where `hostpool gc` looks for this backing's files by default: every
/// hugetlbfs mount, in mount order.
fn gc_dirs() -> Vec<PathBuf> {
    pool_core::host::fs::mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.fstype == "hugetlbfs")
        .map(|m| m.point)
        .collect()
}

/// `auto` on a hugetlbfs mount is this backing.
fn claim(q: &AutoQuery<'_>) -> Option<AutoClaim> {
    use pool_core::HugePages;
    let Some(dir) = q.dir else {
        // No dir: a memfd of the default huge page size, when huge pages are
        // asked for (above anon's and shm-segmented's claims).
        return matches!(q.huge_pages, Some(HugePages::Required | HugePages::Prefer)).then(|| {
            AutoClaim::new(
                20,
                "huge_pages asked for without a dir: a memfd (MFD_HUGETLB) of the default huge \
                 page size, no mount needed",
            )
        });
    };
    let FsKind::Hugetlbfs { page_size } = dir.fs.kind() else {
        return None;
    };
    Some(AutoClaim::new(
        10,
        format!(
            "{} is a hugetlbfs mount with {} pages",
            dir.path.display(),
            format_bytes(page_size)
        ),
    ))
}

/// Where the pages come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Mount(PathBuf),
    Memfd,
}

/// Resolve the page size and the source from the config.
fn resolve(config: &PoolConfig) -> Result<(PageSize, Source)> {
    let asked = config.page_size.map(|p| p.get());
    match &config.dir {
        Some(dir) => {
            let kind = filesystem_kind(dir).map_err(|e| {
                Error::on_input_path(
                    "statfs",
                    dir,
                    e,
                    format!("dir {} cannot be examined", dir.display()),
                    format!(
                        "mount hugetlbfs there first: `mkdir -p {} && mount -t hugetlbfs -o \
                         pagesize=1G none {}`",
                        dir.display(),
                        dir.display()
                    ),
                )
            })?;
            let FsKind::Hugetlbfs { page_size } = kind else {
                return Err(Error::config(format!(
                    "dir {} is not a hugetlbfs mount ({}); mount one (`mount -t hugetlbfs -o pagesize=1G none {}`), \
                     drop dir to use a memfd, or use backing shm-segmented for tmpfs",
                    dir.display(),
                    match kind {
                        FsKind::Tmpfs => "it is tmpfs".to_string(),
                        FsKind::Other { magic } => format!("filesystem magic {magic:#x}"),
                        FsKind::Hugetlbfs { .. } => String::new(),
                    },
                    dir.display()
                )));
            };
            if let Some(asked) = asked
                && asked != page_size
            {
                return Err(Error::config(format!(
                    "page_size {} does not match the {} pages of the hugetlbfs mount {}; drop page_size, or \
                     use a mount with pagesize={}",
                    format_bytes(asked),
                    format_bytes(page_size),
                    dir.display(),
                    format_bytes(asked).replace(' ', "").replace("iB", "")
                )));
            }
            Ok((PageSize::new(page_size)?, Source::Mount(dir.clone())))
        }
        None => {
            // A shared pool without a mount: the creator's memfd, passed to
            // every rank over the socket (a pod with huge pages but no
            // hugetlbfs volume). The file rendezvous opens files by name.
            if let Some(s) = &config.sharing
                && s.rendezvous == pool_core::Rendezvous::File
            {
                return Err(Error::config(
                    "a shared hugetlbfs pool without dir uses a memfd, which the file rendezvous \
                     cannot open by name: use rendezvous = \"socket\" (the default), or give dir \
                     (a hugetlbfs mount every rank sees)",
                ));
            }
            let page = match asked.or_else(hugetlb::default_size) {
                Some(p) => p,
                None => {
                    return Err(Error::NotAvailable {
                        what: "huge pages".into(),
                        reason: "the kernel reports no default huge page size; set page_size"
                            .into(),
                    });
                }
            };
            Ok((PageSize::new(page)?, Source::Memfd))
        }
    }
}

impl Backing for HugetlbfsBacking {
    fn name(&self) -> &'static str {
        NAME
    }

    fn plan(&self, config: &PoolConfig) -> Result<BackingPlan> {
        let (page, source) = resolve(config)?;
        // The kernel must have this page size at all.
        let pool = hugetlb::pool(page.get())?;
        let size = round_to_page(config.size.get(), page)?;
        let dir = match &source {
            Source::Mount(d) => Some(d.as_path()),
            Source::Memfd => None,
        };
        let node = config
            .numa_node
            .as_ref()
            .and_then(pool_core::NumaNode::node);
        let capacity = hugetlb::capacity_checks(size.mapped(), page.get(), dir, node);
        let mut explain = vec![match &source {
            Source::Mount(d) => format!(
                "one file on the hugetlbfs mount {} with {page} pages",
                d.display()
            ),
            Source::Memfd => format!("a memfd (MFD_HUGETLB) of {page} pages: no mount needed"),
        }];
        explain.push(format!(
            "{} asked, {} mapped = {} pages of {page}; the kernel's {page} pool: {} total, {} free, {} reserved, {} available",
            format_bytes(size.logical()),
            format_bytes(size.mapped()),
            size.pages(),
            pool.total,
            pool.free,
            pool.resv,
            pool.available()
        ));
        explain.push("MAP_SHARED without MAP_NORESERVE: pages are reserved at mmap, so a shortage is an error, never SIGBUS".into());
        match (&config.sharing, &source) {
            (Some(s), Source::Mount(_)) => {
                explain.push(format!(
                    "shared by {} ranks as `{}`; rank {} prefaults its own shard, rounded to {page}",
                    s.world, s.name, s.rank
                ));
            }
            (Some(s), Source::Memfd) => {
                explain.push(format!(
                    "shared by {} ranks as `{}` over the socket: the creator's memfd, passed to every \
                     rank, never in any directory; rank {} prefaults its own shard, rounded to {page}",
                    s.world, s.name, s.rank
                ));
            }
            _ => {
                explain.push(
                    "private: the file is never visible (O_TMPFILE, or unlinked at once)".into(),
                );
            }
        }
        let mut plan = BackingPlan::new(NAME, size);
        plan.capacity = capacity;
        plan.options = serde_json::json!({
            "source": match &source { Source::Mount(_) => "mount", Source::Memfd => "memfd" },
            "dir": dir.map(|d| d.display().to_string()),
        });
        plan.explain = explain;
        let remedy = enomem_remedy(&plan);
        let (recheck_dir, numa) = (dir.map(Path::to_path_buf), node);
        let recheck = move || {
            hugetlb::capacity_checks(size.mapped(), page.get(), recheck_dir.as_deref(), numa)
        };
        let files = match source {
            Source::Mount(dir) => {
                let create_dir = dir.clone();
                FilePlan::new(
                    vec![Extent {
                        offset: 0,
                        len: size.mapped(),
                    }],
                    move |e| file::create_private(&create_dir, e.len, page),
                    recheck,
                    remedy,
                )
                .named_in(dir, false)
            }
            Source::Memfd => FilePlan::new(
                vec![Extent {
                    offset: 0,
                    len: size.mapped(),
                }],
                move |e| file::create_memfd("hostpool", e.len, page, true),
                recheck,
                remedy,
            ),
        };
        plan.source = MemorySource::Files(files);
        Ok(plan)
    }
}

fn enomem_remedy(plan: &BackingPlan) -> String {
    let short = plan
        .capacity
        .iter()
        .find(|c| c.verdict == pool_core::host::capacity::Verdict::Short);
    let first = short.or(plan.capacity.first());
    format!(
        "the kernel could not reserve {} huge pages of {} for the pool{}",
        plan.size.pages(),
        plan.size.page(),
        first.map(|c| format!(": {}", c.remedy)).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests;
