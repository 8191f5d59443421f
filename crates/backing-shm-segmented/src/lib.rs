//! `shm-segmented`: files on tmpfs (default `/dev/shm`) stitched into one
//! contiguous range. The whole range is reserved `PROT_NONE`, then each
//! segment file is mapped `MAP_SHARED | MAP_FIXED` at its offset, so the pool
//! is one pointer however many files back it. Private segments are created
//! in parallel and unlinked at once; shared ones are named
//! `hostpool-<name>.pool.<NNNN>`.
//!
//! ```toml
//! backing = "shm-segmented"
//! dir = "/dev/shm"
//! [shm-segmented]
//! segment_size = "4GiB"   # or: segments = 16
//! ```

#![forbid(unsafe_code)]

mod capacity;

mod doctor;

use std::path::{Path, PathBuf};

use pool_core::file;
use pool_core::host::fs::{FsKind, filesystem_kind};
use pool_core::plugin::{AutoClaim, AutoQuery, FilePlan, MemorySource, PrefaultCost, parse_table};
use pool_core::plugin::{Backing, BackingPlan, BackingPlugin};
use pool_core::{ByteSize, Error, PoolConfig, Result};
use pool_core::{PageSize, SegmentSpec, format_bytes, round_to_page, segments};
use serde::{Deserialize, Serialize};

/// The plugin name.
pub const NAME: &str = "shm-segmented";

/// Default directory.
pub const DEFAULT_DIR: &str = "/dev/shm";

/// Segment size when neither `segments` nor `segment_size` is given.
pub const DEFAULT_SEGMENT_SIZE: u64 = 4 << 30;

/// The `[shm-segmented]` table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShmOptions {
    /// Number of segment files (as even as pages allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<u32>,
    /// Size of each segment file (the last holds the remainder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_size: Option<ByteSize>,
}

/// The configured backing.
#[derive(Debug, Clone, Copy)]
pub struct ShmBacking {
    options: ShmOptions,
}

fn build(table: Option<&serde_json::Value>) -> Result<Box<dyn Backing>> {
    let options: ShmOptions = parse_table(NAME, table)?;
    if options.segments.is_some() && options.segment_size.is_some() {
        return Err(Error::config(format!(
            "in table [{NAME}]: give segments or segment_size, not both"
        )));
    }
    Ok(Box::new(ShmBacking { options }))
}

inventory::submit! {
    BackingPlugin::new(
        NAME,
        "tmpfs files (/dev/shm) stitched into one range; segments or segment_size",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_auto(claim, &["tmpfs"])
    .with_cost(PrefaultCost::DEFAULT.with_base_gbps(1.6))
    .with_doctor(doctor::findings)
    .with_gc_dirs(gc_dirs)
}

/// Where `hostpool gc` looks for this backing's files by default: its
/// default directory, `/dev/shm`.
fn gc_dirs() -> Vec<PathBuf> {
    vec![PathBuf::from(DEFAULT_DIR)]
}

/// `auto` on tmpfs is segmented shared-memory files, and so is a shared
/// pool without a dir: files in /dev/shm, which the ranks open by name.
fn claim(q: &AutoQuery<'_>) -> Option<AutoClaim> {
    match q.dir {
        Some(dir) => (dir.fs.kind() == FsKind::Tmpfs).then(|| {
            AutoClaim::new(
                10,
                format!(
                    "{} is tmpfs: segmented shared-memory files",
                    dir.path.display()
                ),
            )
        }),
        None => q.shared.then(|| {
            AutoClaim::new(
                10,
                format!(
                    "a shared pool without a dir: segmented shared-memory files in {DEFAULT_DIR}, \
                 which its ranks open by name"
                ),
            )
        }),
    }
}

fn dir_of(config: &PoolConfig) -> PathBuf {
    config
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

fn check_dir(dir: &Path) -> Result<()> {
    match filesystem_kind(dir) {
        Ok(FsKind::Tmpfs) => Ok(()),
        Ok(FsKind::Hugetlbfs { .. }) => Err(Error::config(format!(
            "dir {} is a hugetlbfs mount; use backing hugetlbfs for it (huge-page files cannot be segmented)",
            dir.display()
        ))),
        Ok(FsKind::Other { magic }) => Err(Error::config(format!(
            "dir {} is not tmpfs (filesystem magic {magic:#x}); use /dev/shm or another tmpfs mount, so the pool \
             lives in memory and not on a disk",
            dir.display()
        ))),
        Err(e) => Err(Error::on_input_path(
            "statfs",
            dir,
            e,
            format!("dir {} cannot be examined", dir.display()),
            "create it or use /dev/shm",
        )),
    }
}

impl Backing for ShmBacking {
    fn name(&self) -> &'static str {
        NAME
    }

    fn plan(&self, config: &PoolConfig) -> Result<BackingPlan> {
        let dir = dir_of(config);
        check_dir(&dir)?;
        let base = PageSize::new(pool_core::base_page_size() as u64)?;
        if let Some(asked) = config.page_size
            && asked.get() != base.get()
        {
            return Err(Error::config(format!(
                "backing {NAME} uses {base} pages, not the {} page_size asked for; for huge pages use backing hugetlbfs",
                format_bytes(asked.get())
            )));
        }
        let size = round_to_page(config.size.get(), base)?;
        let spec = match (self.options.segments, self.options.segment_size) {
            (Some(n), _) => SegmentSpec::Count(n),
            (None, Some(s)) => SegmentSpec::Size(s.get()),
            (None, None) => SegmentSpec::Size(DEFAULT_SEGMENT_SIZE),
        };
        let segs = segments(&size, spec)?;
        let mut explain = vec![format!(
            "{} segment file(s) of up to {} on tmpfs {} stitched into one {} range ({base} pages)",
            segs.len(),
            format_bytes(segs.iter().map(|e| e.len).max().unwrap_or(0)),
            dir.display(),
            format_bytes(size.mapped())
        )];
        explain.push(match &config.sharing {
            Some(s) => format!(
                "shared by {} ranks as `{}`; rank {} prefaults its own shard",
                s.world, s.name, s.rank
            ),
            None => "private: segment files are unlinked as soon as they are created".to_string(),
        });
        let mut plan = BackingPlan::new(NAME, size);
        plan.capacity = capacity::checks(size.mapped(), &dir);
        plan.options = serde_json::json!({
            "dir": dir.display().to_string(),
            "segments": self.options.segments,
            "segment_size": self.options.segment_size.map(|s| s.get()),
        });
        plan.explain = explain;
        plan.segments = segs.clone();
        let remedy = format!(
            "the kernel refused to map {} of tmpfs files from {}; free memory or ask for a smaller --size",
            format_bytes(size.mapped()),
            dir.display()
        );
        let page = size.page();
        let (create_dir, recheck_dir) = (dir.clone(), dir.clone());
        plan.source = MemorySource::Files(
            FilePlan::new(
                segs,
                move |e| file::create_private(&create_dir, e.len, page),
                move || capacity::checks(size.mapped(), &recheck_dir),
                remedy,
            )
            .named_in(dir, true),
        );
        Ok(plan)
    }
}

#[cfg(test)]
mod tests;
