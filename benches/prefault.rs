//! Prefault throughput: the engine against the plain-C kernel path and the
//! memory-bandwidth limit.
//!
//! For a size S (`HOSTPOOL_BENCH_SIZE`, bytes or an IEC unit such as `512MiB`;
//! default 1 GiB, at most 8 GiB) and T in {1, available cores}:
//!
//! - `memset`: the C `raw_memset` over an already-resident buffer, the
//!   bandwidth limit (faulting a page zeroes it, so it cannot be beaten);
//! - `raw-c`: the C `raw_populate` (one `madvise(MADV_POPULATE_WRITE)` per
//!   thread) on a fresh private anonymous 4 KiB mapping;
//! - `engine`: `pool_core::prefault::run` with `populate-write` and T threads
//!   on a fresh mapping.
//!
//! `HOSTPOOL_BENCH_THP=1` adds the two populate methods on a 2 MiB-aligned
//! mapping advised `MADV_HUGEPAGE`.
//!
//! Each fresh mapping is made before the clock starts and unmapped after it
//! stops. Every iteration's bytes/second is collected; at the end the medians,
//! engine/raw-c (the engine must reach 0.9) and engine/memset are printed and
//! written to `$CARGO_TARGET_DIR/criterion/hostpool-prefault-ratios.json`.
//! Because criterion runs one benchmark after another, load that comes and
//! goes skews a ratio of two medians; each group therefore ends with
//! `HOSTPOOL_BENCH_PAIRS` (default 10) back-to-back raw-c/engine pairs, and
//! the median of their ratios is reported next to it as "paired".

mod support;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bench_support::benchkit::median;
use bench_support::reference::raw_populate;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, measurement::WallTime};
use pool_core::{AnonMapOptions, Mmap, base_page_size};
use pool_core::{Extent, PageSize, round_to_page};
use pool_core::{PrefaultChoice, Region, prefault};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The most one benchmark mapping may use (only one is alive at a time).
const MAX_SIZE: u64 = 8 * GIB;

/// A benchmark: (group, method, threads).
type Key = (String, &'static str, usize);

/// Bytes/second of every timed iteration, by benchmark.
static SAMPLES: Mutex<BTreeMap<Key, Vec<f64>>> = Mutex::new(BTreeMap::new());

fn record(group: &str, method: &'static str, threads: usize, bytes: u64, took: Duration) {
    let rate = bytes as f64 / took.as_secs_f64().max(1e-9);
    let mut samples = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    samples
        .entry((group.to_string(), method, threads))
        .or_default()
        .push(rate);
}

fn bench_size() -> u64 {
    let default = if support::measuring() { GIB } else { 64 * MIB };
    let size = match std::env::var("HOSTPOOL_BENCH_SIZE") {
        Ok(s) => match s.parse::<pool_core::ByteSize>() {
            Ok(b) => b.0,
            Err(e) => panic!("HOSTPOOL_BENCH_SIZE: {e}"),
        },
        Err(_) => default,
    };
    assert!(
        (1..=MAX_SIZE).contains(&size),
        "HOSTPOOL_BENCH_SIZE must be between 1 byte and 8 GiB, not {size}"
    );
    PageSize::HUGE_2M
        .round_up(size)
        .expect("at most 8 GiB rounds up")
}

fn thread_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let mut counts = vec![1, cores];
    counts.dedup();
    counts
}

/// A private anonymous mapping, unmapped on drop.
struct Mapping {
    mmap: Mmap,
}

impl Mapping {
    fn new(size: u64, thp: bool) -> Mapping {
        let align = if thp { 2 << 20 } else { base_page_size() };
        let size = round_to_page(size, PageSize::BASE_4K).expect("a 2 MiB multiple");
        let mmap = Mmap::anonymous(
            size,
            AnonMapOptions {
                shared: false,
                align,
            },
        )
        .expect("mmap");
        if thp {
            mmap.region()
                .advise_hugepage()
                .expect("madvise(MADV_HUGEPAGE)");
        }
        Mapping { mmap }
    }

    fn region(&self) -> Region<'_> {
        self.mmap.region()
    }

    fn memset(&mut self, threads: usize) {
        bench_support::memset_mmap(&mut self.mmap, threads).expect("memset");
    }
}

/// Map, fill and unmap the size twice with every core, so the benchmarks do
/// not pay for the host handing the memory back to the VM on first touch
/// (nor, for `thp`, for the first compaction into 2 MiB blocks).
fn warm_up(size: u64, thp: bool) {
    let cores = *thread_counts().last().unwrap_or(&1);
    for round in 1..=2 {
        let start = Instant::now();
        let mut m = Mapping::new(size, thp);
        m.memset(cores);
        drop(m);
        eprintln!(
            "warm-up {round}: map+fill+unmap of {} MiB{} took {:.2?}",
            size / MIB,
            if thp { " (thp)" } else { "" },
            start.elapsed()
        );
    }
}

/// Prefault a fresh mapping per iteration, timing only the prefault.
/// Prefault one fresh mapping of `size` bytes with `method`; returns the time
/// of the prefault alone (mapping and unmapping are outside it).
fn prefault_once(method: support::Method, size: u64, threads: usize, thp: bool) -> Duration {
    let m = Mapping::new(size, thp);
    let region = m.region();
    let region = black_box(&region);
    let mut plan = prefault::plan(
        PrefaultChoice::PopulateWrite,
        Extent {
            offset: 0,
            len: size,
        },
        PageSize::BASE_4K,
        NonZeroUsize::new(threads),
    )
    .expect("populate-write plan");
    // Exactly `threads`, whatever the engine's per-thread minimum says.
    plan.threads = threads;
    let start = Instant::now();
    match method {
        support::Method::RawC => raw_populate(region, threads).expect("raw populate"),
        support::Method::Engine => {
            black_box(prefault::run(
                region,
                &plan,
                &|done| {
                    black_box(done);
                },
                &pool_core::interrupt::Cancel::new(),
            ))
            .expect("engine prefault");
        }
    }
    let took = start.elapsed();
    drop(m);
    took
}

/// Prefault a fresh mapping per iteration, timing only the prefault.
fn populate(
    g: &mut BenchmarkGroup<'_, WallTime>,
    group: &str,
    method: support::Method,
    size: u64,
    threads: usize,
    thp: bool,
) {
    g.bench_function(BenchmarkId::new(method.name(), threads), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let took = prefault_once(method, size, threads, thp);
                total += took;
                record(group, method.name(), threads, size, took);
            }
            total
        })
    });
}

/// engine/raw-c measured in back-to-back pairs, alternating which goes
/// first: load that comes and goes on a small shared machine then hits both
/// sides of a pair instead of one whole criterion benchmark.
fn paired_ratio(size: u64, threads: usize, thp: bool) -> Option<f64> {
    let pairs: usize = std::env::var("HOSTPOOL_BENCH_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if support::measuring() { 10 } else { 0 });
    let ratios = support::paired_ratios(pairs, |m| prefault_once(m, size, threads, thp));
    median(&ratios)
}

/// Paired engine/raw-c ratios by (group, threads).
static PAIRED: Mutex<BTreeMap<(String, usize), f64>> = Mutex::new(BTreeMap::new());

/// Run the pairs for every thread count whose raw-c and engine benchmarks
/// criterion ran (a command-line filter may have skipped them).
fn paired(name: &str, size: u64, thp: bool) {
    for threads in thread_counts() {
        let ran = |method| {
            let samples = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
            samples.contains_key(&(name.to_string(), method, threads))
        };
        if !(ran("raw-c") && ran("engine")) {
            continue;
        }
        if let Some(r) = paired_ratio(size, threads, thp) {
            let mut p = PAIRED.lock().unwrap_or_else(|p| p.into_inner());
            p.insert((name.to_string(), threads), r);
        }
    }
}

fn prefault_4k(c: &mut Criterion) {
    let size = bench_size();
    warm_up(size, false);
    let name = support::group_name("prefault-4k", size);
    let mut g = c.benchmark_group(&name);
    support::configure(&mut g, size);
    for threads in thread_counts() {
        let mut buffer = Mapping::new(size, false);
        buffer.memset(threads);
        g.bench_function(BenchmarkId::new("memset", threads), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    black_box(&mut buffer).memset(threads);
                    let took = start.elapsed();
                    total += took;
                    record(&name, "memset", threads, size, took);
                }
                total
            })
        });
        drop(buffer);
        populate(&mut g, &name, support::Method::RawC, size, threads, false);
        populate(&mut g, &name, support::Method::Engine, size, threads, false);
    }
    g.finish();
    paired(&name, size, false);
}

fn prefault_thp(c: &mut Criterion) {
    if std::env::var("HOSTPOOL_BENCH_THP").as_deref() != Ok("1") {
        return;
    }
    let size = bench_size();
    warm_up(size, true);
    let name = support::group_name("prefault-thp", size);
    let mut g = c.benchmark_group(&name);
    support::configure(&mut g, size);
    for threads in thread_counts() {
        populate(&mut g, &name, support::Method::RawC, size, threads, true);
        populate(&mut g, &name, support::Method::Engine, size, threads, true);
    }
    g.finish();
    paired(&name, size, true);
}

/// Print the medians and ratios and write them as JSON.
fn report(size: u64) {
    let samples = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    let paired = PAIRED.lock().unwrap_or_else(|p| p.into_inner());
    if samples.is_empty() {
        return;
    }
    let gbs = |bps: f64| bps / 1e9;
    println!(
        "\nprefault of {} MiB, medians of every timed iteration:",
        size / MIB
    );
    println!(
        "{:<18} {:<8} {:>7} {:>9} {:>9} {:>9} {:>6}",
        "group", "method", "threads", "GB/s", "min", "max", "n"
    );
    let mut rows = Vec::new();
    for ((group, method, threads), v) in samples.iter() {
        let Some(med) = median(v) else { continue };
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        println!(
            "{group:<18} {method:<8} {threads:>7} {:>9.2} {:>9.2} {:>9.2} {:>6}",
            gbs(med),
            gbs(min),
            gbs(max),
            v.len()
        );
        rows.push(serde_json::json!({
            "group": group, "method": method, "threads": threads,
            "median_bytes_per_second": med, "min_bytes_per_second": min,
            "max_bytes_per_second": max, "iterations": v.len(),
        }));
    }
    if !support::measuring() {
        println!("smoke test (cargo test): one iteration each, no ratios");
        return;
    }
    let med = |group: &str, method: &str, threads: usize| {
        samples
            .iter()
            .find(|((g, m, t), _)| *g == group && *m == method && *t == threads)
            .and_then(|(_, v)| median(v))
    };
    let mut ratios = Vec::new();
    let mut below = false;
    let memset_group = support::group_name("prefault-4k", size);
    for group in [
        memset_group.clone(),
        support::group_name("prefault-thp", size),
    ] {
        for threads in thread_counts() {
            let Some(engine) = med(&group, "engine", threads) else {
                continue;
            };
            let vs_c = med(&group, "raw-c", threads).map(|c| engine / c);
            let vs_memset = med(&memset_group, "memset", threads).map(|m| engine / m);
            let vs_c_paired = paired.get(&(group.clone(), threads)).copied();
            let fmt = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.3}"));
            let ok = vs_c.is_none_or(|r| r >= 0.9);
            below |= !ok;
            println!(
                "{group} threads {threads}: engine/raw-c {} {} (paired {}), engine/memset {}",
                fmt(vs_c),
                if ok { "(>= 0.9)" } else { "(BELOW 0.9)" },
                fmt(vs_c_paired),
                fmt(vs_memset)
            );
            ratios.push(serde_json::json!({
                "group": group, "threads": threads,
                "engine_over_raw_c": vs_c, "engine_over_memset": vs_memset,
                "engine_meets_0_9_of_raw_c": ok,
                "paired_engine_over_raw_c": vs_c_paired,
            }));
        }
    }
    let json = serde_json::json!({
        "size_bytes": size,
        "page_size_bytes": base_page_size(),
        "statistic": "median bytes/second over every timed iteration; paired: median of \
                      engine/raw-c over back-to-back pairs on fresh mappings",
        "target_engine_over_raw_c": 0.9,
        "all_meet_target": !below,
        "medians": rows,
        "ratios": ratios,
    });
    support::write_ratios("hostpool-prefault-ratios.json", &json);
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    prefault_4k(&mut c);
    prefault_thp(&mut c);
    c.final_summary();
    report(bench_size());
}
