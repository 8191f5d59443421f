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
//! 4. `mlock` of resident memory per page size (anon 4 KiB, THP anon,
//!    hugetlbfs 2 MiB, where it is a no-op and reported as such).
//!
//! Each kind of memory is warmed up first (built, filled and released once),
//! each figure is the median of `--repeat` runs, and the methods of one
//! backing and thread count run back to back in each repeat (in a rotating
//! order), so load that comes and goes on a shared machine hits them alike.
//! Measurement code is shared with the criterion benches in
//! [`crate::benchkit`].

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use pool_core::layout::PageSize;
use pool_core::{ByteSize, Error, PinStatus, Pool, PrefaultChoice, Quiet, capacity};
use serde::Serialize;
use serde_json::Value;

use super::write_stdout;
use crate::benchkit::{
    self, ANON_4K, ANON_THP, FreshPool, GIB, HUGETLB_1G, HUGETLB_2M, MIB, Memory, Populate, SHM_4K,
};

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
}

/// What became of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Status {
    /// Timed; `seconds` and `gb_per_s` are set.
    Measured,
    /// Not run; `reason` says why (for example no free huge pages).
    Skipped,
    /// The operation does nothing on this memory; `reason` says why.
    NoOp,
    /// A run failed; `reason` has the error.
    Failed,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
struct Row {
    /// `limit`, `prefault` or `mlock`.
    section: &'static str,
    /// `memset`, `raw-c`, `populate-write`, `touch`, `map-populate`, `mlock`.
    method: &'static str,
    /// The backing (`anon-thp`: anon with transparent huge pages).
    backing: &'static str,
    /// The page size, as people write it.
    page: String,
    page_size_bytes: u64,
    /// Threads asked for.
    threads: usize,
    /// Threads that did the work (fewer when pages cannot be split further).
    threads_used: Option<usize>,
    /// Bytes per run.
    size_bytes: u64,
    status: Status,
    /// Why the row is skipped, a no-op or failed.
    reason: Option<String>,
    /// Median seconds of one run.
    seconds: Option<f64>,
    /// Every run's seconds, in the order they ran.
    seconds_each: Vec<f64>,
    /// `size_bytes / seconds / 1e9`.
    gb_per_s: Option<f64>,
    /// Throughput over memset's with the same threads (1 for mlock).
    ratio_to_memset: Option<f64>,
    /// Throughput over the C reference's on the same memory and threads.
    ratio_to_raw_c: Option<f64>,
    /// Caveats about a measured figure.
    notes: Vec<String>,
}

impl Row {
    fn new(
        section: &'static str,
        method: &'static str,
        memory: &Memory,
        threads: usize,
        size: u64,
    ) -> Row {
        Row {
            section,
            method,
            backing: memory.label,
            page: benchkit::page_label(memory.page),
            page_size_bytes: memory.page.get(),
            threads,
            threads_used: None,
            size_bytes: size,
            status: Status::Measured,
            reason: None,
            seconds: None,
            seconds_each: Vec::new(),
            gb_per_s: None,
            ratio_to_memset: None,
            ratio_to_raw_c: None,
            notes: Vec::new(),
        }
    }

    fn open(&self) -> bool {
        self.status == Status::Measured
    }

    /// Close the row unmeasured; notes about figures no longer apply.
    fn set(&mut self, status: Status, reason: String) {
        if self.open() {
            self.status = status;
            self.reason = Some(reason);
            self.seconds_each.clear();
            self.threads_used = None;
            self.notes.clear();
        }
    }

    fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// The median and rate, once every run is in.
    fn finish(&mut self) {
        if !self.open() {
            return;
        }
        match benchkit::median(&self.seconds_each) {
            Some(s) if s > 0.0 => {
                self.seconds = Some(s);
                self.gb_per_s = Some(self.size_bytes as f64 / s / 1e9);
            }
            _ => {
                self.status = Status::Failed;
                self.reason = Some("no run was timed".into());
            }
        }
    }
}

/// The machine and the run.
#[derive(Debug, Serialize)]
struct Environment {
    /// UTC, RFC 3339.
    date: String,
    kernel: String,
    cores: usize,
    /// `--size`.
    size_requested_bytes: u64,
    /// Rounded up to 2 MiB (1 GiB pages use at least one page).
    size_bytes: u64,
    repeat: usize,
    threads: Vec<usize>,
    mem_available_bytes: Option<u64>,
    transparent_hugepage: Option<String>,
    populate_write_supported: bool,
    /// Free huge pages (free − reserved) per page size when the run started.
    huge_pages_free: BTreeMap<String, u64>,
    /// Seconds each kind of memory took to build, fill and release once.
    warm_up_seconds: BTreeMap<String, f64>,
    hostpool_version: &'static str,
}

/// The whole report (`--json`, `--out`).
#[derive(Debug, Serialize)]
struct Report {
    environment: Environment,
    units: BTreeMap<&'static str, &'static str>,
    rows: Vec<Row>,
}

fn units() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        ("seconds", "median wall time of one run over the repeats"),
        ("gb_per_s", "size_bytes / seconds / 1e9"),
        (
            "ratio_to_memset",
            "gb_per_s over memset's on resident anonymous memory with the same threads (1 for mlock)",
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
        transparent_hugepage: thp_mode(),
        populate_write_supported: pool_core::sys::populate_write_supported(),
        huge_pages_free: [PageSize::HUGE_2M, PageSize::HUGE_1G]
            .into_iter()
            .map(|p| (benchkit::page_label(p), benchkit::free_huge_pages(p)))
            .collect(),
        warm_up_seconds: BTreeMap::new(),
        hostpool_version: env!("CARGO_PKG_VERSION"),
    };
    let mut bench = Bench {
        size,
        threads,
        repeat,
        rows: Vec::new(),
        env: &mut env,
    };
    bench.memset();
    for memory in [ANON_4K, SHM_4K, HUGETLB_2M, HUGETLB_1G] {
        bench.prefault(&memory);
    }
    bench.mlock(&ANON_4K);
    bench.mlock(&ANON_THP);
    bench.mlock_hugetlb(&HUGETLB_2M);
    let mut rows = bench.rows;
    ratios(&mut rows);
    let failed = rows.iter().filter(|r| r.status == Status::Failed).count();
    let report = Report {
        environment: env,
        units: units(),
        rows,
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| Error::config(e.to_string()))?;
    if let Some(out) = &args.out {
        std::fs::write(out, format!("{json}\n")).map_err(|e| Error::Plugin {
            what: format!("writing --out {}", out.display()),
            message: "the report could not be written".into(),
            source: Some(Box::new(e)),
        })?;
    }
    write_stdout(&if args.json { json } else { table(&report) })?;
    if failed > 0 {
        eprintln!("hostpool: error: {failed} measurement(s) failed; see their reasons above");
        return Ok(1);
    }
    Ok(0)
}

/// The run in progress.
struct Bench<'a> {
    size: u64,
    threads: Vec<usize>,
    repeat: usize,
    rows: Vec<Row>,
    env: &'a mut Environment,
}

/// One kind of timed run of a prefault group.
#[derive(Debug, Clone, Copy)]
enum Job {
    Prefault(Populate, usize),
    MapPopulate,
}

impl Bench<'_> {
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

    fn push(&mut self, row: Row) -> usize {
        self.rows.push(row);
        self.rows.len() - 1
    }

    /// `memset` over resident anonymous memory, per thread count.
    fn memset(&mut self) {
        let memory = ANON_4K;
        let size = self.size;
        let rows: Vec<usize> = self
            .threads
            .clone()
            .into_iter()
            .map(|t| self.push(Row::new("limit", "memset", &memory, t, size)))
            .collect();
        if !self.available(&memory, size, &rows) || !self.warm_up(&memory, size, &rows) {
            return;
        }
        progress(&format!("memset over {} resident", mib(size)));
        let pool = memory.plan(size).and_then(|plan| FreshPool::build(&plan));
        let mut pool = match pool {
            Ok(p) => p,
            Err(e) => {
                for &i in &rows {
                    self.rows[i].set(Status::Failed, error_text(&e));
                }
                return;
            }
        };
        // Fault it in first: memset is timed over resident memory.
        if let Err(e) = pool.memset(benchkit::cores()) {
            for &i in &rows {
                self.rows[i].set(Status::Failed, format!("memset: {e}"));
            }
        }
        for r in 0..self.repeat {
            for k in 0..rows.len() {
                let i = rows[(k + r) % rows.len()];
                if !self.rows[i].open() {
                    continue;
                }
                let t = self.rows[i].threads;
                match pool.memset(t) {
                    Ok(took) => {
                        self.rows[i].seconds_each.push(took.as_secs_f64());
                        self.rows[i].threads_used = Some(t);
                    }
                    Err(e) => self.rows[i].set(Status::Failed, format!("memset: {e}")),
                }
            }
        }
        if let Err(e) = pool.teardown() {
            for &i in &rows {
                self.rows[i].note(format!("teardown: {}", error_text(&e)));
            }
        }
        for &i in &rows {
            self.rows[i].finish();
        }
    }

    /// raw-c, populate-write, touch per thread count, and map-populate, on
    /// one kind of memory.
    fn prefault(&mut self, memory: &Memory) {
        let size = memory.round(self.size);
        let mut jobs: Vec<Vec<(usize, Job)>> = Vec::new();
        let mut rows = Vec::new();
        for (n, &t) in self.threads.clone().iter().enumerate() {
            let raw_threads = benchkit::raw_c_threads(size, memory.page, t);
            let mut group = vec![
                (
                    self.push(Row::new("prefault", "raw-c", memory, t, size)),
                    Job::Prefault(Populate::RawC, raw_threads),
                ),
                (
                    self.push(Row::new("prefault", "populate-write", memory, t, size)),
                    Job::Prefault(Populate::Engine(PrefaultChoice::PopulateWrite), t),
                ),
                (
                    self.push(Row::new("prefault", "touch", memory, t, size)),
                    Job::Prefault(Populate::Engine(PrefaultChoice::Touch), t),
                ),
            ];
            if raw_threads != t {
                self.rows[group[0].0].note(format!(
                    "the C reference splits the range into 4 KiB-even slices, which with {t} \
                     threads would start inside a {} page (EINVAL); it ran with {raw_threads}",
                    benchkit::page_label(memory.page)
                ));
            }
            if n == 0 {
                // One mmap call: the kernel populates in the calling thread.
                let i = self.push(Row::new("prefault", "map-populate", memory, 1, size));
                if memory.backing == "shm-segmented" {
                    self.rows[i].note("one /dev/shm file (the pool uses 4 segments)".into());
                }
                group.push((i, Job::MapPopulate));
            }
            rows.extend(group.iter().map(|(i, _)| *i));
            jobs.push(group);
        }
        // Anonymous 4 KiB memory was warmed up for memset already.
        let warm = self.env.warm_up_seconds.contains_key(&Self::label(memory));
        if !self.available(memory, size, &rows) || (!warm && !self.warm_up(memory, size, &rows)) {
            return;
        }
        let plan = match memory.plan(size) {
            Ok(p) => p,
            Err(e) => {
                for &i in &rows {
                    self.rows[i].set(Status::Failed, error_text(&e));
                }
                return;
            }
        };
        for group in &jobs {
            progress(&format!(
                "prefault of {} {} with {} thread(s)",
                mib(size),
                Self::label(memory),
                self.rows[group[0].0].threads
            ));
            for r in 0..self.repeat {
                for k in 0..group.len() {
                    let (i, job) = group[(k + r) % group.len()];
                    if !self.rows[i].open() {
                        continue;
                    }
                    let result = match job {
                        Job::Prefault(how, t) => benchkit::prefault_once(&plan, how, t).map(|t| {
                            let mut notes = Vec::new();
                            if t.fell_back {
                                notes.push(
                                    "populate-write fell back to touch (EINVAL from madvise)"
                                        .to_string(),
                                );
                            }
                            (t.took, Some(t.threads), notes)
                        }),
                        Job::MapPopulate => benchkit::map_populate_once(memory, size).map(|m| {
                            let mut notes = Vec::new();
                            if let Some(p) = m.present.filter(|p| *p < size) {
                                notes.push(format!(
                                    "only {} of {} present after MAP_POPULATE",
                                    mib(p),
                                    mib(size)
                                ));
                            }
                            (m.took, Some(1), notes)
                        }),
                    };
                    let row = &mut self.rows[i];
                    match result {
                        Ok((took, used, notes)) => {
                            row.seconds_each.push(took.as_secs_f64());
                            row.threads_used = used;
                            for n in notes {
                                row.note(n);
                            }
                        }
                        Err(e) => row.set(Status::Failed, error_text(&e)),
                    }
                }
            }
        }
        let pages = usize::try_from(size / memory.page.get()).unwrap_or(usize::MAX);
        for &i in &rows {
            let row = &mut self.rows[i];
            if let Some(used) = row.threads_used
                && row.method != "raw-c"
                && pages < used
            {
                // The engine starts a thread per slice even when some slices
                // are empty; only threads with a page do any work.
                row.threads_used = Some(pages);
                row.note(format!(
                    "only {pages} of the {used} threads had a page to fault ({pages} x {})",
                    benchkit::page_label(memory.page)
                ));
            }
            if size != self.size {
                row.note(format!(
                    "{} per run: the size rounded up to whole {} pages",
                    mib(size),
                    benchkit::page_label(memory.page)
                ));
            }
            row.finish();
        }
    }

    /// `mlock` of a resident pool through the mlock pinner, per repeat on a
    /// fresh pool.
    fn mlock(&mut self, memory: &Memory) {
        let size = memory.round(self.size);
        let i = self.push(Row::new("mlock", "mlock", memory, 1, size));
        if !self.available(memory, size, &[i]) {
            return;
        }
        // Anonymous 4 KiB memory was warmed up by memset already.
        if memory.thp && !self.warm_up(memory, size, &[i]) {
            return;
        }
        progress(&format!("mlock of {} {}", mib(size), Self::label(memory)));
        for _ in 0..self.repeat {
            match mlock_once(memory, size) {
                Ok(Mlocked::Took(secs, thp)) => {
                    let row = &mut self.rows[i];
                    row.seconds_each.push(secs);
                    row.threads_used = Some(1);
                    if let Some(thp) = thp {
                        row.note(format!(
                            "AnonHugePages {} of {} (transparent huge pages are best effort)",
                            mib(thp),
                            mib(size)
                        ));
                    }
                }
                Ok(Mlocked::Skipped(reason)) => {
                    self.rows[i].set(Status::Skipped, reason);
                    break;
                }
                Ok(Mlocked::NoOp(reason)) => {
                    self.rows[i].set(Status::NoOp, reason);
                    break;
                }
                Err(e) => {
                    self.rows[i].set(Status::Failed, error_text(&e));
                    break;
                }
            }
        }
        self.rows[i].finish();
    }

    /// `mlock` on hugetlb: a no-op, confirmed with the pinner when the pages
    /// are free.
    fn mlock_hugetlb(&mut self, memory: &Memory) {
        let size = memory.round(self.size);
        let i = self.push(Row::new("mlock", "mlock", memory, 1, size));
        let generic = format!(
            "{} pages are reserved huge pages, which are never swapped: mlock succeeds and does \
             nothing (VmLck stays 0)",
            benchkit::page_label(memory.page)
        );
        let reason = match memory.unavailable(size) {
            Some(why) => format!("{generic}; not built here: {why}"),
            None => match mlock_once(memory, size) {
                Ok(Mlocked::NoOp(note)) => note,
                Ok(Mlocked::Took(..)) => {
                    format!("{generic}; the mlock pinner called mlock anyway, which it should not")
                }
                Ok(Mlocked::Skipped(why)) => format!("{generic}; the pinner skipped: {why}"),
                Err(e) => format!("{generic}; building the pool failed: {}", error_text(&e)),
            },
        };
        self.rows[i].set(Status::NoOp, reason);
    }
}

/// What one mlock run found.
enum Mlocked {
    /// `mlock` took this many seconds; AnonHugePages of the pool for THP.
    Took(f64, Option<u64>),
    /// The pinner did not call `mlock`, and says why.
    NoOp(String),
    /// Pinning was skipped (for example `RLIMIT_MEMLOCK`), with the reason.
    Skipped(String),
}

/// Build a prefaulted pool of `memory` pinned with the mlock pinner, read the
/// pinner's own timing of the `mlock` call, and tear the pool down.
fn mlock_once(memory: &Memory, size: u64) -> Result<Mlocked, Error> {
    let mut config = memory.config(size);
    config.prefault = PrefaultChoice::PopulateWrite;
    config.pin.kind = "mlock".into();
    config.pin.required = false;
    let plan = pool_core::PoolPlan::new(config)?;
    let pool = Pool::build(&plan, &Quiet)?;
    let report = pool.report();
    let thp = if memory.thp {
        pool.region()
            .and_then(|r| benchkit::smaps_bytes(r.addr() as usize, &["AnonHugePages"]))
    } else {
        None
    };
    let details = &report.pin.details;
    let outcome = match report.pin.status {
        PinStatus::Pinned if details["mlock_called"] == Value::Bool(false) => Mlocked::NoOp(
            details["note"]
                .as_str()
                .unwrap_or("the pinner did not call mlock")
                .to_string(),
        ),
        PinStatus::Pinned => match details["seconds"].as_f64() {
            Some(s) => Mlocked::Took(s, thp),
            None => Mlocked::Skipped("the mlock pinner reported no time".into()),
        },
        PinStatus::Skipped | PinStatus::Off => Mlocked::Skipped(
            report
                .pin
                .reason
                .clone()
                .unwrap_or_else(|| "pinning was skipped".into()),
        ),
    };
    let report = pool.teardown();
    if !report.teardown_issues.is_empty() {
        return Err(Error::Plugin {
            what: "teardown".into(),
            message: format!("{:?}", report.teardown_issues),
            source: None,
        });
    }
    Ok(outcome)
}

/// Fill in every measured row's ratios, or say why one is missing.
fn ratios(rows: &mut [Row]) {
    // The reference row's rate, or why there is none.
    let reference =
        |rows: &[Row], what: &str, threads: usize, pick: &dyn Fn(&Row) -> bool| match rows
            .iter()
            .find(|r| pick(r))
        {
            Some(r) => r.gb_per_s.ok_or_else(|| {
                format!("no ratio to {what}: its row with {threads} thread(s) was not measured")
            }),
            None => Err(format!(
                "no ratio to {what}: it ran with other thread counts (add --threads {threads})"
            )),
        };
    for i in 0..rows.len() {
        let Some(gbs) = rows[i].gb_per_s else {
            continue;
        };
        let (threads, backing, page) = (rows[i].threads, rows[i].backing, rows[i].page_size_bytes);
        let memset = reference(rows, "memset", threads, &|r| {
            r.method == "memset" && r.threads == threads
        });
        let raw_c = (rows[i].section == "prefault").then(|| {
            reference(rows, "raw-c", threads, &|r| {
                r.method == "raw-c"
                    && r.backing == backing
                    && r.page_size_bytes == page
                    && r.threads == threads
            })
        });
        let row = &mut rows[i];
        match memset {
            Ok(m) => row.ratio_to_memset = Some(gbs / m),
            Err(why) => row.note(why),
        }
        match raw_c {
            Some(Ok(c)) => row.ratio_to_raw_c = Some(gbs / c),
            Some(Err(why)) => row.note(why),
            None => {}
        }
    }
}

/// The report as a table, with the reasons and notes below it.
fn table(report: &Report) -> String {
    let env = &report.environment;
    let mut s = format!(
        "hostpool bench: {} per run, median of {}, {} core(s), Linux {}, {}\n\
         GB/s = 1e9 bytes/s. x memset: over memset on resident memory, same threads. \
         x raw C: over one madvise(MADV_POPULATE_WRITE) per thread in C, same memory and threads.\n\n",
        mib(env.size_bytes),
        env.repeat,
        env.cores,
        env.kernel,
        env.date
    );
    s.push_str(&format!(
        "{:<15} {:<14} {:<6} {:>7} {:>9} {:>9} {:>8}  {}\n",
        "method", "backing", "page", "threads", "GB/s", "x memset", "x raw C", "notes"
    ));
    let mut notes: Vec<String> = Vec::new();
    let mut refs = |texts: Vec<String>| -> String {
        texts
            .into_iter()
            .map(|t| {
                let n = match notes.iter().position(|x| *x == t) {
                    Some(n) => n + 1,
                    None => {
                        notes.push(t);
                        notes.len()
                    }
                };
                format!("[{n}]")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}"));
    let mut section = "";
    for row in &report.rows {
        if row.section != section {
            if !section.is_empty() {
                s.push('\n');
            }
            section = row.section;
        }
        let mut texts = row.reason.iter().cloned().collect::<Vec<_>>();
        texts.extend(row.notes.iter().cloned());
        let figure = match (row.status, row.gb_per_s) {
            (Status::Measured, Some(g)) => format!("{g:.2}"),
            (Status::NoOp, _) => "no-op".into(),
            (Status::Skipped, _) => "skipped".into(),
            _ => "FAILED".into(),
        };
        let threads = match row.threads_used {
            Some(u) if u != row.threads => format!("{}({u})", row.threads),
            _ => row.threads.to_string(),
        };
        if row.method == "mlock"
            && let Some(secs) = row.seconds
        {
            texts.push(format!(
                "{:.1} ms per GiB",
                secs * 1e3 / (row.size_bytes as f64 / GIB as f64)
            ));
        }
        s.push_str(&format!(
            "{:<15} {:<14} {:<6} {:>7} {:>9} {:>9} {:>8}  {}\n",
            row.method,
            row.backing,
            row.page.replace(' ', ""),
            threads,
            figure,
            ratio(row.ratio_to_memset),
            ratio(row.ratio_to_raw_c),
            refs(texts)
        ));
    }
    if !notes.is_empty() {
        s.push('\n');
        for (n, t) in notes.iter().enumerate() {
            s.push_str(&format!("[{}] {t}\n", n + 1));
        }
    }
    if !env.warm_up_seconds.is_empty() {
        s.push_str("\nwarm-up (build, fill, release once): ");
        s.push_str(
            &env.warm_up_seconds
                .iter()
                .map(|(k, v)| format!("{k} {v:.2} s"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        s.push('\n');
    }
    s.trim_end().to_string()
}

fn progress(line: &str) {
    eprintln!("hostpool bench: {line}");
}

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

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The system-wide THP mode (`always`, `madvise` or `never`).
fn thp_mode() -> Option<String> {
    let s = read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled")?;
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_string())
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

fn utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_798_675_200 + 3_723), "2026-12-31T01:02:03Z");
    }

    fn row(method: &'static str, memory: &Memory, threads: usize, secs: f64) -> Row {
        let mut r = Row::new("prefault", method, memory, threads, GIB);
        if method == "memset" {
            r.section = "limit";
        }
        r.seconds_each.push(secs);
        r.finish();
        r
    }

    #[test]
    fn ratios_pair_same_memory_and_threads() {
        let mut rows = vec![
            row("memset", &ANON_4K, 2, 0.1),
            row("raw-c", &ANON_4K, 2, 0.4),
            row("populate-write", &ANON_4K, 2, 0.5),
            row("raw-c", &SHM_4K, 2, 1.0),
        ];
        ratios(&mut rows);
        let pw = &rows[2];
        assert!((pw.ratio_to_memset.unwrap() - 0.2).abs() < 1e-9);
        assert!((pw.ratio_to_raw_c.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(rows[0].ratio_to_memset, Some(1.0));
        assert_eq!(rows[0].ratio_to_raw_c, None);
        assert!((rows[3].ratio_to_raw_c.unwrap() - 1.0).abs() < 1e-9);
    }
}
