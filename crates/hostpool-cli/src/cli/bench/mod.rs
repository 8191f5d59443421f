//! `hostpool bench`: prefault and mlock measured against memset, side by side
//! in one run.
//!
//! 1. `memset` over resident anonymous memory of the size: the limit, since
//!    faulting a page zeroes it.
//! 2. Prefault per backing and page size (anon 4 KiB, shm-segmented 4 KiB,
//!    hugetlbfs 2 MiB and 1 GiB memfds), per method — the engine with
//!    populate-write and with touch, and `mmap(MAP_POPULATE)` of the same kind
//!    of memory — and per thread count.
//! 3. The C reference (`raw_populate`) on the same memory and threads, so each
//!    figure has its ratio to the kernel's path with nothing around it.
//! 4. `alloc`: the path operators run, `hostpool alloc --json` of the same
//!    memory and threads in a process of its own, timed by the prefault phase
//!    it reports, in the same rotation as the others (issue 13: this path was
//!    at 0.7-0.85 of the C reference on 2 MiB pages when the engine rows said
//!    1.0).
//! 5. `mlock` of resident memory per page size (anon 4 KiB, THP anon,
//!    hugetlbfs 2 MiB, where it is a no-op and reported as such).
//! 6. `keeper` (`keeper.rs`): time to usable for a restarting engine, a full
//!    build against an attach to a keeper's pool, and the keeper's clearing
//!    between leases against memset, on shm-segmented 4 KiB and hugetlbfs
//!    2 MiB.
//!
//! Each kind of memory is warmed up first (built, filled and released once),
//! each figure is the median of `--repeat` runs, and the methods of one
//! backing and thread count run back to back in each repeat (in a rotating
//! order), so load that comes and goes on a shared machine hits them alike.
//! Measurement code is shared with the criterion benches in
//! [`bench_support::benchkit`].

mod env;
mod jobs;
mod keeper;
mod mlock;
mod rows;
mod table;

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::Args;
use pool_core::PageSize;
use pool_core::host::{capacity, thp};
use pool_core::{ByteSize, Error};
use serde::Serialize;

use super::write_stdout;
use bench_support::benchkit::{
    self, ANON_4K, ANON_THP, GIB, HUGETLB_1G, HUGETLB_2M, MIB, Memory, SHM_4K,
};
use env::{Environment, read_trimmed, utc_now};
use rows::{Row, Status};
use table::{ratios, table};

/// `hostpool bench` arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Bytes per measurement: bytes or an IEC unit (512MiB, 2GiB). Default
    /// 1GiB; at most half of MemAvailable. 1 GiB pages use at least one page.
    #[arg(long, value_name = "SIZE")]
    pub size: Option<ByteSize>,
    /// Thread count to measure (repeatable; default 1 and the available cores).
    #[arg(long = "threads", value_name = "N")]
    pub threads: Vec<NonZeroUsize>,
    /// Runs per measurement; the median is reported.
    #[arg(long, value_name = "N", default_value = "3")]
    pub repeat: NonZeroUsize,
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The keeper section's pool size (default: --size). Its huge pages are
    /// counted as free pages; its other memory must fit in half of
    /// MemAvailable, as --size.
    #[arg(long, value_name = "SIZE")]
    pub keeper_size: Option<ByteSize>,
    /// Run only these sections (repeatable; memset, the limit every ratio
    /// is to, always runs). Default: all.
    #[arg(long, value_enum, value_name = "SECTION")]
    pub only: Vec<Section>,
}

/// The sections `--only` picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    /// Prefault per backing, page size, method and threads, and `alloc`.
    Prefault,
    /// `mlock` per page size.
    Mlock,
    /// Attach to a keeper against a build, and the keeper's clearing.
    Keeper,
}

/// The whole report (`--json`, `--out`).
#[derive(Debug, Serialize)]
struct Report {
    environment: Environment,
    units: BTreeMap<&'static str, &'static str>,
    rows: Vec<Row>,
}

/// What the report's figures mean (`units` in the JSON).
fn units() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        ("seconds", "median wall time of one run over the repeats"),
        ("gb_per_s", "size_bytes / seconds / 1e9"),
        (
            "ratio_to_memset",
            "gb_per_s over memset's on resident anonymous memory with the same threads (1 for mlock)",
        ),
        (
            "speedup_over_build",
            "keeper attach rows: the build's seconds over the attach's (time to usable without \
             and with a keeper)",
        ),
        (
            "ratio_to_raw_c",
            "gb_per_s over the C reference's (one madvise(MADV_POPULATE_WRITE) per thread) on the \
             same backing, page size and threads",
        ),
    ])
}

/// Run `hostpool bench`.
pub fn run(args: BenchArgs) -> Result<i32, Error> {
    let requested = args.size.map_or(GIB, ByteSize::get);
    if requested == 0 {
        return Err(Error::config(
            "--size must be at least one byte; write bytes or an IEC unit such as 1GiB",
        ));
    }
    let available = capacity::meminfo("MemAvailable");
    let half = available
        .map(|a| a / 2)
        .ok_or_else(|| Error::NotAvailable {
            what: "MemAvailable".into(),
            reason: "/proc/meminfo could not be read; hostpool bench sizes itself from it".into(),
        })?;
    let size = ANON_4K.round(requested);
    if size > half {
        return Err(Error::Capacity {
            resource: "half of MemAvailable (the most hostpool bench uses)".into(),
            need: size,
            free: half,
            remedy: "ask for a smaller --size, or free memory".into(),
        });
    }
    if let Some(dir) = args.out.as_ref().and_then(|p| p.parent())
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        return Err(Error::config(format!(
            "--out {}: the directory {} does not exist",
            args.out
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            dir.display()
        )));
    }
    let mut threads: Vec<usize> = if args.threads.is_empty() {
        benchkit::default_thread_counts()
    } else {
        args.threads.iter().map(|t| t.get()).collect()
    };
    let mut seen = Vec::new();
    threads.retain(|t| {
        let new = !seen.contains(t);
        seen.push(*t);
        new
    });
    let repeat = args.repeat.get();

    let mut env = Environment {
        date: utc_now(),
        kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
        cores: benchkit::cores(),
        size_requested_bytes: requested,
        size_bytes: size,
        repeat,
        threads: threads.clone(),
        mem_available_bytes: available,
        transparent_hugepage: thp::mode(),
        populate_write_supported: pool_core::populate_write_supported(),
        huge_pages_free: [PageSize::HUGE_2M, PageSize::HUGE_1G]
            .into_iter()
            .map(|p| (benchkit::page_label(p), benchkit::free_huge_pages(p)))
            .collect(),
        warm_up_seconds: BTreeMap::new(),
        hostpool_version: env!("CARGO_PKG_VERSION"),
    };
    let keeper_size = args.keeper_size.map_or(size, ByteSize::get);
    if keeper_size == 0 {
        return Err(Error::config(
            "--keeper-size must be at least one byte; write bytes or an IEC unit such as 16GiB",
        ));
    }
    let mut bench = Bench {
        size,
        keeper_size,
        half_available: half,
        threads,
        repeat,
        rows: Vec::new(),
        env: &mut env,
    };
    let runs = |s: Section| args.only.is_empty() || args.only.contains(&s);
    bench.memset();
    if runs(Section::Prefault) {
        for memory in [ANON_4K, SHM_4K, HUGETLB_2M, HUGETLB_1G] {
            bench.prefault(&memory);
        }
    }
    if runs(Section::Mlock) {
        bench.mlock(&ANON_4K);
        bench.mlock(&ANON_THP);
        bench.mlock_hugetlb(&HUGETLB_2M);
    }
    if runs(Section::Keeper) {
        for memory in [SHM_4K, HUGETLB_2M] {
            bench.keeper(&memory);
        }
    }
    let mut rows = bench.rows;
    ratios(&mut rows);
    let failed = rows.iter().filter(|r| r.status == Status::Failed).count();
    let report = Report {
        environment: env,
        units: units(),
        rows,
    };
    let json = super::to_json(&report)?;
    if let Some(out) = &args.out {
        std::fs::write(out, format!("{json}\n")).map_err(|e| Error::Plugin {
            what: format!("writing --out {}", out.display()),
            message: "the report could not be written".into(),
            source: Some(Box::new(e)),
        })?;
    }
    write_stdout(&if args.json { json } else { table(&report) })?;
    if failed > 0 {
        super::say(format_args!(
            "hostpool: error: {failed} measurement(s) failed; see their reasons above"
        ));
        return Ok(1);
    }
    Ok(0)
}

/// The run in progress.
struct Bench<'a> {
    size: u64,
    /// The keeper section's size.
    keeper_size: u64,
    /// Half of MemAvailable at the start: the most memory other than huge
    /// pages a row may use.
    half_available: u64,
    threads: Vec<usize>,
    repeat: usize,
    rows: Vec<Row>,
    env: &'a mut Environment,
}

impl Bench<'_> {
    /// How progress lines and `warm_up_seconds` name the memory.
    fn label(memory: &Memory) -> String {
        format!("{} {}", memory.label, benchkit::page_label(memory.page))
    }

    /// Warm the memory up; on failure every row in `rows` fails.
    fn warm_up(&mut self, memory: &Memory, size: u64, rows: &[usize]) -> bool {
        let label = Self::label(memory);
        let result = memory
            .plan(size)
            .and_then(|plan| benchkit::warm_up(&plan, benchkit::cores()));
        match result {
            Ok(took) => {
                let secs = took.as_secs_f64();
                progress(&format!(
                    "warm-up of {label}: build, fill and release {} took {secs:.2} s",
                    mib(size)
                ));
                self.env.warm_up_seconds.insert(label, secs);
                true
            }
            Err(e) => {
                for &i in rows {
                    self.rows[i].set(
                        Status::Failed,
                        format!("warm-up failed: {}", error_text(&e)),
                    );
                }
                false
            }
        }
    }

    /// Mark every row in `rows` skipped when the memory cannot be had.
    fn available(&mut self, memory: &Memory, size: u64, rows: &[usize]) -> bool {
        match memory.unavailable(size) {
            None => true,
            Some(reason) => {
                progress(&format!("skipping {}: {reason}", Self::label(memory)));
                for &i in rows {
                    self.rows[i].set(Status::Skipped, reason.clone());
                }
                false
            }
        }
    }

    /// Add a row; returns its index.
    fn push(&mut self, row: Row) -> usize {
        self.rows.push(row);
        self.rows.len() - 1
    }
}

/// One line of progress on stderr.
fn progress(line: &str) {
    super::say(format_args!("hostpool bench: {line}"));
}

/// A size in whole GiB, else in MiB.
fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else {
        format!("{} MiB", bytes / MIB)
    }
}

/// An error and its causes on one line.
fn error_text(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(" (cause: {s})"));
        source = s.source();
    }
    text
}
