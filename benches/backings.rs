//! Prefault throughput per backing and page size, and the cost of a joiner
//! attaching to pages a peer already faulted.
//!
//! Part 1, for each backing — `anon` (4 KiB), `shm-segmented` (4 KiB tmpfs
//! files in /dev/shm, 4 segments), `hugetlbfs` 2 MiB and 1 GiB (memfd) — at a
//! size S and T in {1, available cores}:
//!
//! - `memset`: the C `raw_memset` over an already-resident pool of the same
//!   backing, the bandwidth limit (faulting a page zeroes it);
//! - `raw-c`: the C `raw_populate` (one `madvise(MADV_POPULATE_WRITE)` per
//!   thread) on a fresh pool built with `prefault = none`;
//! - `engine`: `pool_core::prefault::run` with `populate-write` and exactly T
//!   threads on a fresh pool.
//!
//! S is 1 GiB (2 GiB for 1 GiB pages, which needs 2 free pages), or
//! `HOSTPOOL_BENCH_SIZE` (bytes or an IEC unit, at most 8 GiB; rounded up to
//! the page size); 64 MiB (one 1 GiB page) under `cargo test`. A hugetlbfs
//! group whose pages are not free (see `cargo xtask hugepages up`) is skipped
//! with the reason printed.
//!
//! "vLLM's method" is measured too: one single-threaded
//! `madvise(MADV_POPULATE_WRITE)` over one /dev/shm file (the shm backing
//! with one segment, `raw-c` with one thread); the report gives each
//! backing's speed-up over it.
//!
//! Part 2, attach: a joiner of a shared pool maps pages a peer already
//! faulted. For a populated file — a 4 KiB /dev/shm file (1 GiB), a 2 MiB
//! hugetlb memfd (4 GiB, or what is free) and a 1 GiB hugetlb memfd (2 GiB
//! if free) — a second `MAP_SHARED` mapping of the same fd is made present
//! with `mmap(MAP_POPULATE)`, mmap + `MADV_POPULATE_WRITE`, mmap +
//! `MADV_POPULATE_READ`, or mmap + the engine with its own thread count. The
//! clock covers the `mmap` and the populate; `munmap` is outside it.
//! `HOSTPOOL_BENCH_ATTACH_SIZE` overrides the sizes.
//!
//! As in `prefault.rs`: flat sampling, every fresh pool made before the clock
//! starts and torn down after it stops, a warm-up per backing, and
//! `HOSTPOOL_BENCH_PAIRS` (default 10) back-to-back raw-c/engine pairs per
//! group whose median ratio is the one judged against 0.9 ("paired"). The
//! medians and ratios are printed and written to
//! `$CARGO_TARGET_DIR/criterion/hostpool-backings-ratios.json`.

mod support;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bench_support::SharedMap;
use bench_support::benchkit::{
    self, PRESENT_FIELDS, Populate, free_huge_pages, median, page_label, raw_c_slices_aligned,
    smaps_bytes,
};
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, measurement::WallTime};
use hostpool::pool_core::{ByteSize, PoolPlan, PrefaultChoice, file, prefault};
use hostpool::pool_core::{Extent, PageSize};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The most one benchmark may map (only one pool or file is alive at a time).
const MAX_SIZE: u64 = 8 * GIB;
/// Engine/raw-c throughput the engine must reach.
const TARGET: f64 = 0.9;

/// A benchmark: (group, method, threads).
type Key = (String, &'static str, usize);

/// Bytes/second of every timed iteration, by benchmark.
static SAMPLES: Mutex<BTreeMap<Key, Vec<f64>>> = Mutex::new(BTreeMap::new());
/// Paired engine/raw-c ratios by (group, threads).
static PAIRED: Mutex<BTreeMap<(String, usize), f64>> = Mutex::new(BTreeMap::new());
/// Every group that ran: (size, page size, kind), kind being `backing`,
/// `vllm` or `attach`.
static GROUPS: Mutex<BTreeMap<String, (u64, u64, &'static str)>> = Mutex::new(BTreeMap::new());
/// Groups skipped, with why.
static SKIPPED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn record(group: &str, method: &'static str, threads: usize, bytes: u64, took: Duration) {
    let rate = bytes as f64 / took.as_secs_f64().max(1e-9);
    lock(&SAMPLES)
        .entry((group.to_string(), method, threads))
        .or_default()
        .push(rate);
}

fn skip(group: String, reason: String) {
    println!("skipping {group}: {reason}");
    lock(&SKIPPED).push((group, reason));
}

/// A size from the environment, checked against [`MAX_SIZE`].
fn env_size(var: &str) -> Option<u64> {
    let s = std::env::var(var).ok()?;
    let size = match s.parse::<ByteSize>() {
        Ok(b) => b.get(),
        Err(e) => panic!("{var}: {e}"),
    };
    assert!(
        (1..=MAX_SIZE).contains(&size),
        "{var} must be between 1 byte and 8 GiB, not {size}"
    );
    Some(size)
}

/// `size` rounded up to `page` (and to 2 MiB, so every group of one run has
/// the same size for 4 KiB and 2 MiB pages).
fn round_size(size: u64, page: PageSize) -> u64 {
    let page = page.get().max(2 * MIB);
    size.div_ceil(page) * page
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

fn thread_counts() -> Vec<usize> {
    let mut counts = vec![1, cores()];
    counts.dedup();
    counts
}

/// One backing configuration under test.
#[derive(Clone, Copy)]
struct Backing {
    /// The group name's prefix.
    kind: &'static str,
    /// The backing plugin.
    backing: &'static str,
    page: PageSize,
    /// `[shm-segmented] segments`.
    segments: Option<u32>,
}

const ANON: Backing = Backing {
    kind: "backing-anon-4k",
    backing: "anon",
    page: PageSize::BASE_4K,
    segments: None,
};
const SHM: Backing = Backing {
    kind: "backing-shm-4k",
    backing: "shm-segmented",
    page: PageSize::BASE_4K,
    segments: Some(4),
};
const HUGE_2M: Backing = Backing {
    kind: "backing-hugetlb-2m",
    backing: "hugetlbfs",
    page: PageSize::HUGE_2M,
    segments: None,
};
const HUGE_1G: Backing = Backing {
    kind: "backing-hugetlb-1g",
    backing: "hugetlbfs",
    page: PageSize::HUGE_1G,
    segments: None,
};
/// vLLM's method: one /dev/shm file, one thread.
const VLLM: Backing = Backing {
    kind: "vllm-shm-1file",
    backing: "shm-segmented",
    page: PageSize::BASE_4K,
    segments: Some(1),
};

impl Backing {
    fn hugetlb(&self) -> bool {
        self.backing == "hugetlbfs"
    }

    /// The size to bench, or why the group is skipped.
    fn size(&self) -> Result<u64, String> {
        let size = match env_size("HOSTPOOL_BENCH_SIZE") {
            Some(s) => round_size(s, self.page),
            None if self.page == PageSize::HUGE_1G => {
                if support::measuring() {
                    2 * GIB
                } else {
                    GIB
                }
            }
            None if support::measuring() => GIB,
            None => 64 * MIB,
        };
        if self.hugetlb() {
            let need = size / self.page.get();
            let free = free_huge_pages(self.page);
            if free < need {
                return Err(format!(
                    "needs {need} free {} huge pages, {free} free (run `cargo xtask hugepages up`)",
                    page_label(self.page)
                ));
            }
        }
        Ok(size)
    }

    /// The plan of a pool of `size` bytes that is mapped but not prefaulted.
    fn plan(&self, size: u64) -> PoolPlan {
        let memory = bench_support::benchkit::Memory {
            label: self.backing,
            backing: self.backing,
            page: self.page,
            segments: self.segments,
            thp: false,
        };
        PoolPlan::new(memory.config(size)).expect("pool plan")
    }
}

/// Build, fill and tear down a pool of the group's size twice with every
/// core, so the benchmarks do not pay for the host handing the memory back
/// to the VM on first touch.
fn warm_up(plan: &PoolPlan, name: &str) {
    for round in 1..=2 {
        let took = benchkit::warm_up(plan, cores()).expect("warm-up");
        eprintln!("warm-up {round} of {name}: build+fill+teardown took {took:.2?}");
    }
}

/// Prefault one fresh pool with `method` and exactly `threads` threads;
/// returns the time of the prefault alone.
fn prefault_once(plan: &PoolPlan, method: support::Method, threads: usize) -> Duration {
    let how = match method {
        support::Method::RawC => Populate::RawC,
        support::Method::Engine => Populate::Engine(PrefaultChoice::PopulateWrite),
    };
    benchkit::prefault_once(plan, how, threads)
        .expect("prefault of a fresh pool")
        .took
}

fn populate(
    g: &mut BenchmarkGroup<'_, WallTime>,
    group: &str,
    plan: &PoolPlan,
    method: support::Method,
    threads: usize,
) {
    let size = plan.backing_plan().map_or(0, |bp| bp.size.mapped());
    g.bench_function(BenchmarkId::new(method.name(), threads), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let took = prefault_once(plan, method, threads);
                total += took;
                record(group, method.name(), threads, size, took);
            }
            total
        })
    });
}

/// `memset` over a resident pool of the same backing.
fn memset(g: &mut BenchmarkGroup<'_, WallTime>, group: &str, plan: &PoolPlan, threads: usize) {
    let size = plan.backing_plan().map_or(0, |bp| bp.size.mapped());
    let mut pool = benchkit::FreshPool::build(plan).expect("pool build");
    pool.memset(threads).expect("memset buffer");
    g.bench_function(BenchmarkId::new("memset", threads), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let took = black_box(&mut pool).memset(threads).expect("memset");
                total += took;
                record(group, "memset", threads, size, took);
            }
            total
        })
    });
    pool.teardown().expect("teardown");
}

fn pairs() -> usize {
    std::env::var("HOSTPOOL_BENCH_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if support::measuring() { 10 } else { 0 })
}

/// engine/raw-c measured in back-to-back pairs on fresh pools, alternating
/// which goes first, for every thread count whose raw-c and engine
/// benchmarks criterion ran (a command-line filter may have skipped them).
fn paired(name: &str, plan: &PoolPlan) {
    for threads in thread_counts() {
        let ran = |method| lock(&SAMPLES).contains_key(&(name.to_string(), method, threads));
        if !(ran("raw-c") && ran("engine")) {
            continue;
        }
        let ratios = support::paired_ratios(pairs(), |m| prefault_once(plan, m, threads));
        if let Some(r) = median(&ratios) {
            lock(&PAIRED).insert((name.to_string(), threads), r);
        }
    }
}

/// memset, raw-c and engine for one backing at every thread count.
fn backing_group(c: &mut Criterion, b: Backing) {
    let size = match b.size() {
        Ok(s) => s,
        Err(reason) => return skip(b.kind.to_string(), reason),
    };
    let name = support::group_name(b.kind, size);
    let plan = b.plan(size);
    warm_up(&plan, &name);
    lock(&GROUPS).insert(name.clone(), (size, b.page.get(), "backing"));
    let mut g = c.benchmark_group(&name);
    support::configure(&mut g, size);
    for threads in thread_counts() {
        memset(&mut g, &name, &plan, threads);
        if b.hugetlb() && !raw_c_slices_aligned(size, b.page, threads) {
            println!(
                "{name}: raw-c with {threads} threads skipped: its 4 KiB-even slices would \
                 start inside a {} page (EINVAL)",
                page_label(b.page)
            );
        } else {
            populate(&mut g, &name, &plan, support::Method::RawC, threads);
        }
        populate(&mut g, &name, &plan, support::Method::Engine, threads);
    }
    g.finish();
    paired(&name, &plan);
}

/// vLLM's prefault: one `MADV_POPULATE_WRITE` by one thread over one
/// /dev/shm file.
fn vllm_group(c: &mut Criterion) {
    let size = match VLLM.size() {
        Ok(s) => s,
        Err(reason) => return skip(VLLM.kind.to_string(), reason),
    };
    let name = support::group_name(VLLM.kind, size);
    let plan = VLLM.plan(size);
    lock(&GROUPS).insert(name.clone(), (size, VLLM.page.get(), "vllm"));
    let mut g = c.benchmark_group(&name);
    support::configure(&mut g, size);
    populate(&mut g, &name, &plan, support::Method::RawC, 1);
    g.finish();
}

// ---------------------------------------------------------------- attach

#[derive(Clone, Copy, PartialEq, Eq)]
enum Attach {
    MapPopulate,
    PopulateWrite,
    PopulateRead,
    Engine,
}

impl Attach {
    const ALL: [Attach; 4] = [
        Attach::MapPopulate,
        Attach::PopulateWrite,
        Attach::PopulateRead,
        Attach::Engine,
    ];

    fn name(self) -> &'static str {
        match self {
            Attach::MapPopulate => "map-populate",
            Attach::PopulateWrite => "populate-write",
            Attach::PopulateRead => "populate-read",
            Attach::Engine => "engine",
        }
    }
}

/// Map the file a second time and make every page present with `method`;
/// returns the time of the mmap and populate (the munmap is outside it) and
/// the mapping, still alive.
fn attach_once(
    fd: BorrowedFd<'_>,
    len: usize,
    page: PageSize,
    method: Attach,
    threads: usize,
) -> (Duration, SharedMap) {
    let start = Instant::now();
    let m = SharedMap::new(fd, len, method == Attach::MapPopulate);
    match method {
        Attach::MapPopulate => {}
        Attach::PopulateWrite => m.populate(true),
        Attach::PopulateRead => m.populate(false),
        Attach::Engine => {
            let region = m.region(page);
            let mut pf = prefault::plan(
                PrefaultChoice::PopulateWrite,
                Extent {
                    offset: 0,
                    len: region.mapped_len(),
                },
                page,
                None,
            )
            .expect("populate-write plan");
            pf.threads = threads;
            black_box(prefault::run(
                &region,
                &pf,
                &|done| {
                    black_box(done);
                },
                &pool_core::interrupt::Cancel::new(),
            ))
            .expect("engine prefault");
        }
    }
    (start.elapsed(), m)
}

/// The file a peer created and populated: the fd and its mapping.
struct Populated {
    fd: OwnedFd,
    peer: SharedMap,
}

fn populated_file(page: PageSize, size: u64) -> Populated {
    let fd = if page == PageSize::BASE_4K {
        // O_TMPFILE: nothing is left in /dev/shm whatever happens.
        file::create_private(Path::new("/dev/shm"), size, page).expect("/dev/shm file")
    } else {
        file::create_memfd("hostpool-bench-attach", size, page, true).expect("hugetlb memfd")
    };
    let len = usize::try_from(size).expect("size fits in usize");
    let peer = SharedMap::new(fd.as_fd(), len, false);
    peer.populate(true);
    Populated { fd, peer }
}

fn attach_group(c: &mut Criterion, kind: &'static str, page: PageSize) {
    let wanted = match env_size("HOSTPOOL_BENCH_ATTACH_SIZE") {
        Some(s) => round_size(s, page),
        None if !support::measuring() => round_size(64 * MIB, page),
        None if page == PageSize::BASE_4K => GIB,
        None if page == PageSize::HUGE_2M => 4 * GIB,
        None => 2 * GIB,
    };
    let size = if page == PageSize::BASE_4K {
        wanted
    } else {
        let free = free_huge_pages(page) * page.get();
        // What is free, in whole GiB (or whole pages below 1 GiB).
        let fits = if free >= GIB {
            free / GIB * GIB
        } else {
            free / page.get() * page.get()
        };
        let size = wanted.min(fits);
        if size == 0 || (page == PageSize::HUGE_1G && size < wanted) {
            return skip(
                kind.to_string(),
                format!(
                    "needs {} free {} huge pages, {} free",
                    wanted / page.get(),
                    page_label(page),
                    free / page.get()
                ),
            );
        }
        if size < wanted {
            println!(
                "{kind}: {} MiB of {} pages free, attaching {} MiB instead of {} MiB",
                free / MIB,
                page_label(page),
                size / MIB,
                wanted / MIB
            );
        }
        size
    };
    let name = support::group_name(kind, size);
    let len = usize::try_from(size).expect("size fits in usize");
    let file = populated_file(page, size);
    let fd = file.fd.as_fd();
    lock(&GROUPS).insert(name.clone(), (size, page.get(), "attach"));
    let engine_threads = prefault::thread_count(size, None, cores());
    let mut g = c.benchmark_group(&name);
    support::configure(&mut g, size);
    for method in Attach::ALL {
        let threads = if method == Attach::Engine {
            engine_threads
        } else {
            1
        };
        // Check once, outside the clock, that the method really makes every
        // page present in the second mapping.
        let (_, m) = attach_once(fd, len, page, method, threads);
        match smaps_bytes(m.addr(), &PRESENT_FIELDS) {
            Some(p) if p == size => {}
            Some(p) => println!(
                "{name} {}: only {} of {} MiB present after attach",
                method.name(),
                p / MIB,
                size / MIB
            ),
            None => println!(
                "{name} {}: smaps unreadable, presence unchecked",
                method.name()
            ),
        }
        drop(m);
        g.bench_function(BenchmarkId::new(method.name(), threads), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (took, m) = attach_once(fd, len, page, method, threads);
                    drop(m);
                    total += took;
                    record(&name, method.name(), threads, size, took);
                }
                total
            })
        });
    }
    g.finish();
    drop(file.peer);
}

// ---------------------------------------------------------------- report

fn fmt(r: Option<f64>) -> String {
    r.map_or("-".to_string(), |r| format!("{r:.3}"))
}

/// Print the medians and ratios and write them as JSON.
fn report() {
    let samples = lock(&SAMPLES).clone();
    let paired = lock(&PAIRED).clone();
    let groups = lock(&GROUPS).clone();
    let skipped = lock(&SKIPPED).clone();
    for (group, reason) in &skipped {
        println!("skipped {group}: {reason}");
    }
    if samples.is_empty() {
        return;
    }
    let gbs = |bps: f64| bps / 1e9;
    println!("\nmedians of every timed iteration (GB/s = 1e9 bytes/s):");
    println!(
        "{:<26} {:<15} {:>7} {:>9} {:>9} {:>9} {:>11} {:>6}",
        "group", "method", "threads", "GB/s", "min", "max", "seconds", "n"
    );
    let mut rows = Vec::new();
    for ((group, method, threads), v) in &samples {
        let Some(med) = median(v) else { continue };
        let size = groups.get(group).map_or(0, |g| g.0);
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        let secs = size as f64 / med;
        println!(
            "{group:<26} {method:<15} {threads:>7} {:>9.2} {:>9.2} {:>9.2} {secs:>11.6} {:>6}",
            gbs(med),
            gbs(min),
            gbs(max),
            v.len()
        );
        rows.push(serde_json::json!({
            "group": group, "method": method, "threads": threads, "size_bytes": size,
            "median_bytes_per_second": med, "min_bytes_per_second": min,
            "max_bytes_per_second": max, "median_seconds": secs, "iterations": v.len(),
        }));
    }
    if !support::measuring() {
        println!("smoke test (cargo test): one iteration each, no ratios");
        return;
    }
    let med = |group: &str, method: &str, threads: usize| {
        samples
            .iter()
            .find(|((g, m, t), _)| g == group && *m == method && *t == threads)
            .and_then(|(_, v)| median(v))
    };

    // Engine against raw C and memset, per backing and thread count.
    println!("\nengine/raw-c (target >= {TARGET}, judged on the paired median) and engine/memset:");
    println!(
        "{:<26} {:>7} {:>13} {:>13} {:>14} {:>8}",
        "group", "threads", "paired e/c", "medians e/c", "engine/memset", "verdict"
    );
    let mut ratios = Vec::new();
    let mut below = false;
    for (group, (_, page, kind)) in &groups {
        if *kind != "backing" {
            continue;
        }
        for threads in thread_counts() {
            let Some(engine) = med(group, "engine", threads) else {
                continue;
            };
            let vs_c = med(group, "raw-c", threads).map(|c| engine / c);
            let vs_c_paired = paired.get(&(group.clone(), threads)).copied();
            let vs_memset = med(group, "memset", threads).map(|m| engine / m);
            let judged = vs_c_paired.or(vs_c);
            let ok = judged.is_none_or(|r| r >= TARGET);
            below |= !ok;
            println!(
                "{group:<26} {threads:>7} {:>13} {:>13} {:>14} {:>8}",
                fmt(vs_c_paired),
                fmt(vs_c),
                fmt(vs_memset),
                match judged {
                    None => "no raw-c",
                    Some(_) if ok => "pass",
                    Some(_) => "BELOW",
                }
            );
            ratios.push(serde_json::json!({
                "group": group, "page_size_bytes": page, "threads": threads,
                "engine_bytes_per_second": engine,
                "paired_engine_over_raw_c": vs_c_paired,
                "engine_over_raw_c": vs_c, "engine_over_memset": vs_memset,
                "engine_meets_0_9_of_raw_c": ok,
            }));
        }
    }

    // Speed-up over vLLM's single-threaded populate of one /dev/shm file.
    let vllm = groups
        .iter()
        .find(|(_, g)| g.2 == "vllm")
        .and_then(|(name, _)| med(name, "raw-c", 1));
    let mut speedups = Vec::new();
    if let Some(v) = vllm {
        println!(
            "\nvLLM's method (1 thread, one MADV_POPULATE_WRITE over one /dev/shm file): {:.2} GB/s",
            gbs(v)
        );
        println!(
            "{:<26} {:>7} {:>10} {:>9}",
            "group", "threads", "engine GB/s", "speed-up"
        );
        for (group, (_, _, kind)) in &groups {
            if *kind != "backing" {
                continue;
            }
            for threads in thread_counts() {
                let Some(engine) = med(group, "engine", threads) else {
                    continue;
                };
                println!(
                    "{group:<26} {threads:>7} {:>10.2} {:>8.2}x",
                    gbs(engine),
                    engine / v
                );
                speedups.push(serde_json::json!({
                    "group": group, "threads": threads,
                    "engine_bytes_per_second": engine, "speedup_over_vllm": engine / v,
                }));
            }
        }
    }

    // Attach: every method, and the fastest, per page size.
    let mut attach = Vec::new();
    for (group, (size, page, kind)) in &groups {
        if *kind != "attach" {
            continue;
        }
        println!(
            "\nattach {group} (page {}): second mapping of a populated file",
            page_label(PageSize::new(*page).unwrap_or(PageSize::BASE_4K))
        );
        let mut methods = Vec::new();
        for method in Attach::ALL {
            let Some((threads, rate)) = samples
                .iter()
                .find(|((g, m, _), _)| g == group && *m == method.name())
                .and_then(|((_, _, t), v)| median(v).map(|r| (*t, r)))
            else {
                continue;
            };
            let secs = *size as f64 / rate;
            println!(
                "  {:<15} threads {threads}: {:>11.6} s {:>10.2} GB/s",
                method.name(),
                secs,
                gbs(rate)
            );
            methods.push((method.name(), threads, secs, rate));
        }
        let fastest = methods
            .iter()
            .max_by(|a, b| a.3.total_cmp(&b.3))
            .map(|m| m.0);
        println!("  fastest: {}", fastest.unwrap_or("-"));
        attach.push(serde_json::json!({
            "group": group, "size_bytes": size, "page_size_bytes": page,
            "methods": methods.iter().map(|(m, t, s, r)| serde_json::json!({
                "method": m, "threads": t, "median_seconds": s, "median_bytes_per_second": r,
            })).collect::<Vec<_>>(),
            "fastest": fastest,
        }));
    }

    let json = serde_json::json!({
        "statistic": "median bytes/second over every timed iteration; paired: median of \
                      engine/raw-c over back-to-back pairs on fresh pools",
        "target_engine_over_raw_c": TARGET,
        "all_meet_target": !below,
        "groups": groups.iter().map(|(g, (size, page, kind))| serde_json::json!({
            "group": g, "kind": kind, "size_bytes": size, "page_size_bytes": page,
        })).collect::<Vec<_>>(),
        "skipped": skipped.iter().map(|(g, r)| serde_json::json!({"group": g, "reason": r}))
            .collect::<Vec<_>>(),
        "medians": rows,
        "ratios": ratios,
        "vllm_bytes_per_second": vllm,
        "speedup_over_vllm": speedups,
        "attach": attach,
    });
    support::write_ratios("hostpool-backings-ratios.json", &json);
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    for b in [ANON, SHM, HUGE_2M, HUGE_1G] {
        backing_group(&mut c, b);
    }
    vllm_group(&mut c);
    attach_group(&mut c, "attach-shm-4k", PageSize::BASE_4K);
    attach_group(&mut c, "attach-hugetlb-2m", PageSize::HUGE_2M);
    attach_group(&mut c, "attach-hugetlb-1g", PageSize::HUGE_1G);
    c.final_summary();
    report();
}
