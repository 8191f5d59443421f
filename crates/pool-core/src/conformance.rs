//! The conformance suite every backing runs (feature `conformance`).
//!
//! A backing's tests describe a few good configs and a few bad ones; [`run`]
//! builds real pools through [`crate::PoolPlan`] and [`crate::Pool`] and checks:
//!
//! - **size and alignment**: the region starts on a page boundary, the mapped
//!   size is the logical size rounded up to the page, and the report agrees;
//! - **writes visible**: a pattern written at every page of the whole mapped
//!   range reads back intact;
//! - **prefault residency**: after prefault every page is resident
//!   (`mincore`), and without prefault fewer are (unless the backing
//!   populates at map time);
//! - **teardown leaves nothing**: no teardown issues, no mapping left at the
//!   address, and none of the backing's files left on disk;
//! - **bad configs rejected**: each bad config fails with a message that
//!   contains the expected words, before anything is mapped.
//!
//! Failures are collected, not panicked, so a test asserts the list is empty
//! and sees every failure at once.

use std::path::PathBuf;

use crate::config::{PoolConfig, PrefaultChoice};
use crate::error::Error;
use crate::pool::{Pool, PoolPlan, Quiet};
use crate::sys;

/// A config the backing must reject, and words its error must contain.
#[derive(Debug, Clone)]
pub struct BadConfig {
    /// The config.
    pub config: PoolConfig,
    /// A substring of the error message.
    pub expect: &'static str,
}

/// What a backing submits to the suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Configs that must build (keep them small: tens of MiB).
    pub good: Vec<PoolConfig>,
    /// Configs that must be rejected.
    pub bad: Vec<BadConfig>,
    /// The backing makes pages resident at map time (for example a joiner
    /// that attaches to pages a peer already faulted).
    pub populates_at_map: bool,
}

/// One failed check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The check.
    pub check: &'static str,
    /// The config, briefly.
    pub case: String,
    /// What was wrong.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}]: {}", self.check, self.case, self.message)
    }
}

/// Run every check on every config; returns the failures (empty = conformant).
pub fn run(suite: &Suite) -> Vec<Failure> {
    let mut failures = Vec::new();
    for config in &suite.good {
        let case = describe(config);
        for (check, result) in [
            ("size and alignment", size_and_alignment(config)),
            ("writes visible", writes_visible(config)),
            (
                "prefault residency",
                prefault_residency(config, suite.populates_at_map),
            ),
            ("teardown leaves nothing", teardown_leaves_nothing(config)),
            ("teardown keeps the range", teardown_keeps_the_range(config)),
        ] {
            if let Err(message) = result {
                failures.push(Failure {
                    check,
                    case: case.clone(),
                    message,
                });
            }
        }
    }
    for bad in &suite.bad {
        if let Err(message) = bad_config_rejected(bad) {
            failures.push(Failure {
                check: "bad config rejected",
                case: describe(&bad.config),
                message,
            });
        }
    }
    failures
}

fn describe(c: &PoolConfig) -> String {
    let mut s = format!("backing={} size={}", c.backing, c.size);
    if let Some(d) = &c.dir {
        s += &format!(" dir={}", d.display());
    }
    if let Some(p) = c.page_size {
        s += &format!(" page_size={p}");
    }
    for (k, v) in &c.plugins {
        s += &format!(" [{k}]={v}");
    }
    s
}

fn build(config: &PoolConfig) -> Result<Pool, String> {
    let plan = PoolPlan::new(config.clone()).map_err(|e| format!("plan failed: {e}"))?;
    Pool::build(&plan, &Quiet).map_err(|e| format!("build failed: {e}"))
}

fn finish(pool: Pool) -> Result<(), String> {
    let report = pool.teardown();
    if report.teardown_issues.is_empty() {
        Ok(())
    } else {
        Err(format!("teardown issues: {:?}", report.teardown_issues))
    }
}

/// The region starts on a page boundary and sizes round correctly.
///
/// # Errors
/// What did not hold.
pub fn size_and_alignment(config: &PoolConfig) -> Result<(), String> {
    let pool = build(config)?;
    let region = pool.region().ok_or("built pool has no region")?;
    let page = region.page().get();
    let r = pool.report();
    let checks = [
        (
            (region.addr() as u64).is_multiple_of(page),
            format!("address {:p} not aligned to {page}", region.addr()),
        ),
        (
            region.logical_len() == config.size.get(),
            format!(
                "logical {} != asked {}",
                region.logical_len(),
                config.size.get()
            ),
        ),
        (
            region.mapped_len().is_multiple_of(page),
            format!("mapped {} not a multiple of {page}", region.mapped_len()),
        ),
        (
            region.mapped_len() >= region.logical_len()
                && region.mapped_len() - region.logical_len() < page,
            format!(
                "mapped {} is not logical {} rounded up to {page}",
                region.mapped_len(),
                region.logical_len()
            ),
        ),
        (
            r.page_size == page
                && r.mapped_bytes == region.mapped_len()
                && r.logical_bytes == region.logical_len(),
            "report disagrees with the region".to_string(),
        ),
        (
            config.page_size.is_none_or(|p| p.get() == page),
            format!(
                "page size {page} is not the {:?} asked for",
                config.page_size
            ),
        ),
    ];
    let failed: Vec<_> = checks
        .into_iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, m)| m)
        .collect();
    finish(pool)?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// A pattern written across the whole mapped range reads back intact.
///
/// # Errors
/// The first offset that differs.
pub fn writes_visible(config: &PoolConfig) -> Result<(), String> {
    let pool = build(config)?;
    let region = pool.region().ok_or("built pool has no region")?;
    let stride = sys::base_page_size();
    region.write_pattern(stride, 0x5a);
    let bad = region.check_pattern(stride, 0x5a);
    finish(pool)?;
    match bad {
        None => Ok(()),
        Some(off) => Err(format!(
            "byte at offset {off} did not read back what was written"
        )),
    }
}

fn resident(pool: &Pool) -> Result<(u64, u64), String> {
    let region = pool.region().ok_or("built pool has no region")?;
    let n = region
        .resident_pages()
        .map_err(|e| format!("mincore: {e}"))?;
    Ok((
        n,
        region.mapped_len().div_ceil(sys::base_page_size() as u64),
    ))
}

/// After prefault every page is resident; without it fewer are.
///
/// # Errors
/// The counts that did not hold.
pub fn prefault_residency(config: &PoolConfig, populates_at_map: bool) -> Result<(), String> {
    let mut with = config.clone();
    if with.prefault == PrefaultChoice::None {
        with.prefault = PrefaultChoice::Auto;
    }
    let pool = build(&with)?;
    let (res, total) = resident(&pool)?;
    finish(pool)?;
    if res != total {
        return Err(format!(
            "after prefault {res} of {total} base pages are resident"
        ));
    }
    if !populates_at_map {
        let mut without = config.clone();
        without.prefault = PrefaultChoice::None;
        let pool = build(&without)?;
        let (res, total) = resident(&pool)?;
        finish(pool)?;
        if res == total {
            return Err(format!(
                "all {total} pages are resident even without prefault, so the check proves nothing \
                 (set populates_at_map if the backing does that on purpose)"
            ));
        }
    }
    Ok(())
}

/// The mappings of /proc/self/maps that lie within `[start, end)`.
fn maps_within(start: u64, end: u64) -> Result<Vec<(u64, u64)>, String> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| {
        format!("/proc/self/maps cannot be read ({e}), so what teardown left cannot be checked")
    })?;
    Ok(maps
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        // Every mapping that overlaps the range, not only those inside it.
        .filter(|(a, b)| *a < end && *b > start)
        .collect())
}

/// Teardown reports no issues, the mapping is gone, and so are the files.
///
/// # Errors
/// What was left behind.
pub fn teardown_leaves_nothing(config: &PoolConfig) -> Result<(), String> {
    let pool = build(config)?;
    let region = pool.region().ok_or("built pool has no region")?;
    let (start, end) = (
        region.addr() as u64,
        region.addr() as u64 + region.mapped_len(),
    );
    let files: Vec<PathBuf> = pool.files();
    // A segmented pool is one mapping per segment: together they must tile
    // the range exactly.
    let mut live = maps_within(start, end)?;
    live.sort_unstable();
    let tiles = live.first().map(|m| m.0) == Some(start)
        && live.last().map(|m| m.1) == Some(end)
        && live.windows(2).all(|w| w[0].1 == w[1].0);
    if !tiles {
        return Err(format!(
            "the live pool {start:#x}-{end:#x} is not covered by its mappings in /proc/self/maps: {live:x?}"
        ));
    }
    finish(pool)?;
    let mut left = Vec::new();
    // Other threads may map new memory into the freed range; only the pool's
    // own mappings, start and end alike, count as left behind.
    let after = maps_within(start, end)?;
    for m in live.iter().filter(|m| after.contains(m)) {
        left.push(format!(
            "mapping {:#x}-{:#x} still in /proc/self/maps",
            m.0, m.1
        ));
    }
    for f in files {
        if std::fs::symlink_metadata(&f).is_ok() {
            left.push(format!("file {} still exists", f.display()));
        }
    }
    if left.is_empty() {
        Ok(())
    } else {
        Err(left.join("; "))
    }
}

/// [`Pool::teardown_keeping_range`] gives the memory and the files back
/// but keeps the address range reserved by a placeholder of zero pages
/// (what the Python package's `close()` relies on, so that a pointer a
/// caller kept never reaches memory mapped there later); dropping the
/// placeholder unmaps the range.
///
/// # Errors
/// What did not hold: no placeholder (a backing with a mapping of its own
/// must implement `Mapping::teardown_keeping_range`), another range, the
/// pool's bytes still readable, a file left, a teardown issue.
pub fn teardown_keeps_the_range(config: &PoolConfig) -> Result<(), String> {
    let pool = build(config)?;
    let region = pool.region().ok_or("built pool has no region")?;
    let (start, len) = (region.addr() as usize, region.mapped_len());
    if !region.write_byte(0, 0xa5) {
        return Err("the pool's first byte cannot be written".into());
    }
    let files: Vec<PathBuf> = pool.files();
    let (report, kept) = pool.teardown_keeping_range();
    if !report.teardown_issues.is_empty() {
        return Err(format!("teardown issues: {:?}", report.teardown_issues));
    }
    let kept = kept.ok_or(
        "no placeholder: the backing's mapping does not implement \
         Mapping::teardown_keeping_range, so a kept address may reach memory mapped there later",
    )?;
    if (kept.addr(), kept.len() as u64) != (start, len) {
        return Err(format!(
            "the placeholder covers {:#x}+{}, the pool was {start:#x}+{len}",
            kept.addr(),
            kept.len()
        ));
    }
    if kept.first_byte().is_some_and(|b| b != 0) {
        return Err("the pool's bytes are still readable at its address after teardown".into());
    }
    if let Some(f) = files.iter().find(|f| std::fs::symlink_metadata(f).is_ok()) {
        return Err(format!("file {} still exists", f.display()));
    }
    let end = start as u64 + len;
    drop(kept);
    if maps_within(start as u64, end)?.contains(&(start as u64, end)) {
        return Err("dropping the placeholder left its mapping".into());
    }
    Ok(())
}

/// A bad config fails, before mapping, with the expected words.
///
/// # Errors
/// What happened instead.
pub fn bad_config_rejected(bad: &BadConfig) -> Result<(), String> {
    let err: Error = match PoolPlan::new(bad.config.clone()) {
        Err(e) => e,
        Ok(plan) => match Pool::build(&plan, &Quiet) {
            Err(e) => e,
            Ok(pool) => {
                finish(pool)?;
                return Err("was accepted and built".to_string());
            }
        },
    };
    let msg = err.to_string();
    if msg.contains(bad.expect) {
        Ok(())
    } else {
        Err(format!("error {msg:?} does not contain {:?}", bad.expect))
    }
}
