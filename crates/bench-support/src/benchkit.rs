//! What `hostpool bench` and the criterion benches (`benches/`) share: the
//! kinds of memory measured, fresh unfaulted pools, one timed prefault with
//! the engine or the C reference ([`crate::reference`]), `mmap(MAP_POPULATE)`
//! of the same kind of memory, warm-up, and the small helpers around them.
//!
//! Every measurement maps fresh memory before its clock starts and releases it
//! after the clock stops, so only the prefault itself is timed. Nothing is
//! left behind: files are `O_TMPFILE`s or memfds, and huge pages go back to
//! the kernel's pool when the mapping is released.

use std::hint::black_box;
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use backing_hugetlbfs::host as hugetlb;
use pool_core::{
    ByteSize, Context, Error, Pool, PoolConfig, PoolPlan, PrefaultChoice, Quiet, Region, Result,
    file, prefault,
};
use pool_core::{Extent, PageSize};

use crate::reference::raw_populate;

/// One kibibyte.
pub const KIB: u64 = 1 << 10;
/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// One gibibyte.
pub const GIB: u64 = 1 << 30;

/// The median of `v` (the mean of the middle two for an even count); `None`
/// when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The cores this process may run on (`available_parallelism`, at least 1).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// The thread counts measured by default: 1 and the available cores.
pub fn default_thread_counts() -> Vec<usize> {
    let mut counts = vec![1, cores()];
    counts.dedup();
    counts
}

/// Huge pages of `page` a new mapping can take now: `free_hugepages −
/// resv_hugepages` from sysfs (0 when the kernel has no such size). Surplus
/// pages that overcommit might still allocate are not counted.
pub fn free_huge_pages(page: PageSize) -> u64 {
    let dir = hugetlb::sysfs_dir(page.get());
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    read("free_hugepages").saturating_sub(read("resv_hugepages"))
}

/// A page size as people write it: `4 KiB`, `2 MiB`, `1 GiB`.
pub fn page_label(page: PageSize) -> String {
    match page.get() {
        p if p >= GIB => format!("{} GiB", p / GIB),
        p if p >= MIB => format!("{} MiB", p / MIB),
        p => format!("{} KiB", p / KIB),
    }
}

/// Whether the C reference's slices (4 KiB-page-even, as in
/// `benches/c/raw_populate.c`) all start on a `page` boundary: `madvise` on a
/// hugetlb range that does not fails with `EINVAL`.
pub fn raw_c_slices_aligned(size: u64, page: PageSize, threads: usize) -> bool {
    let base = 4 * KIB;
    let n = threads.clamp(1, 1024) as u64;
    let (each, extra) = ((size / base) / n, (size / base) % n);
    let mut at = 0;
    (0..n).all(|i| {
        let ok = page.is_aligned(at);
        at += (each + u64::from(i < extra)) * base;
        ok
    })
}

/// The most threads, at most `threads`, the C reference can use on `size`
/// bytes of `page` pages ([`raw_c_slices_aligned`]; one always can).
pub fn raw_c_threads(size: u64, page: PageSize, threads: usize) -> usize {
    (1..=threads.max(1))
        .rev()
        .find(|&t| raw_c_slices_aligned(size, page, t))
        .unwrap_or(1)
}

/// One kind of memory: a backing with its page size and options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// How reports name it: the backing, `-thp` for transparent huge pages.
    pub label: &'static str,
    /// The backing plugin.
    pub backing: &'static str,
    /// The page size.
    pub page: PageSize,
    /// `[shm-segmented] segments`.
    pub segments: Option<u32>,
    /// `[anon] thp = true`.
    pub thp: bool,
}

/// Private anonymous memory in 4 KiB pages.
pub const ANON_4K: Memory = Memory {
    label: "anon",
    backing: "anon",
    page: PageSize::BASE_4K,
    segments: None,
    thp: false,
};
/// Private anonymous memory advised `MADV_HUGEPAGE` (transparent 2 MiB pages,
/// best effort).
pub const ANON_THP: Memory = Memory {
    label: "anon-thp",
    backing: "anon",
    page: PageSize::HUGE_2M,
    segments: None,
    thp: true,
};
/// 4 KiB tmpfs files in /dev/shm, 4 segments.
pub const SHM_4K: Memory = Memory {
    label: "shm-segmented",
    backing: "shm-segmented",
    page: PageSize::BASE_4K,
    segments: Some(4),
    thp: false,
};
/// A hugetlb memfd of 2 MiB pages.
pub const HUGETLB_2M: Memory = Memory {
    label: "hugetlbfs",
    backing: "hugetlbfs",
    page: PageSize::HUGE_2M,
    segments: None,
    thp: false,
};
/// A hugetlb memfd of 1 GiB pages.
pub const HUGETLB_1G: Memory = Memory {
    label: "hugetlbfs",
    backing: "hugetlbfs",
    page: PageSize::HUGE_1G,
    segments: None,
    thp: false,
};

impl Memory {
    /// Whether it is reserved huge pages.
    pub fn hugetlb(&self) -> bool {
        self.backing == "hugetlbfs"
    }

    /// `size` rounded up to the page and to 2 MiB, so the 4 KiB and 2 MiB
    /// kinds of one run have the same size.
    pub fn round(&self, size: u64) -> u64 {
        let page = self.page.get().max(2 * MIB);
        size.div_ceil(page).saturating_mul(page)
    }

    /// The config of a pool of `size` bytes of this memory: mapped, not
    /// prefaulted, not pinned.
    pub fn config(&self, size: u64) -> PoolConfig {
        let mut config = PoolConfig {
            size: ByteSize(size),
            backing: self.backing.to_string(),
            prefault: PrefaultChoice::None,
            page_size: self.hugetlb().then(|| ByteSize(self.page.get())),
            ..PoolConfig::default()
        };
        if let Some(n) = self.segments {
            config.plugins.insert(
                self.backing.to_string(),
                serde_json::json!({ "segments": n }),
            );
        }
        if self.thp {
            config
                .plugins
                .insert(self.backing.to_string(), serde_json::json!({ "thp": true }));
        }
        config
    }

    /// The plan of [`Memory::config`].
    ///
    /// # Errors
    /// As for [`PoolPlan::new`], e.g. a page size the kernel lacks.
    pub fn plan(&self, size: u64) -> Result<PoolPlan> {
        PoolPlan::new(self.config(size))
    }

    /// Why `size` bytes of this memory cannot be had now, if they cannot:
    /// for huge pages, too few free pages of the size (checked strictly,
    /// without overcommit); for every kind, the plan's capacity checks.
    pub fn unavailable(&self, size: u64) -> Option<String> {
        if self.hugetlb() {
            if !hugetlb::sysfs_dir(self.page.get()).exists() {
                return Some(format!(
                    "this kernel has no {} huge pages",
                    page_label(self.page)
                ));
            }
            let need = size / self.page.get();
            let free = free_huge_pages(self.page);
            if free < need {
                return Some(format!(
                    "needs {need} free {} huge page(s), {free} free (reserve them with \
                     `cargo xtask hugepages up` or /sys/kernel/mm/hugepages)",
                    page_label(self.page)
                ));
            }
        }
        match self.plan(size) {
            Ok(plan) => pool_core::host::capacity::require(
                plan.backing_plan().map_or(&[][..], |bp| &bp.capacity),
            )
            .err()
            .map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }
}

/// A freshly built pool whose pages have not been faulted in.
#[derive(Debug)]
pub struct FreshPool {
    pool: Pool,
}

impl FreshPool {
    /// Build the pool of `plan` (whose prefault should be `none`).
    ///
    /// # Errors
    /// As for [`Pool::build`].
    pub fn build(plan: &PoolPlan) -> Result<FreshPool> {
        let pool = Pool::build(plan, &Quiet)?;
        Ok(FreshPool { pool })
    }

    /// The pool's memory.
    pub fn region(&self) -> Region<'_> {
        self.pool
            .region()
            .expect("a FreshPool owns its pool until teardown, which consumes it")
    }

    /// The pool itself (its report, for example).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Write every byte with `memset` on `threads` threads (the C
    /// `raw_memset`); returns the time it took.
    ///
    /// # Errors
    /// `EINVAL` for no threads, or the errno of `pthread_create`.
    pub fn memset(&mut self, threads: usize) -> io::Result<Duration> {
        let start = Instant::now();
        crate::sys::memset_pool(&mut self.pool, threads)?;
        Ok(start.elapsed())
    }

    /// Tear the pool down.
    ///
    /// # Errors
    /// [`Error::Plugin`] listing the steps teardown could not undo.
    pub fn teardown(self) -> Result<()> {
        let report = self.pool.teardown();
        if report.teardown_issues.is_empty() {
            return Ok(());
        }
        Err(Error::Plugin {
            what: "teardown".into(),
            message: report
                .teardown_issues
                .iter()
                .map(|i| format!("{}: {}", i.step, i.detail))
                .collect::<Vec<_>>()
                .join("; "),
            source: None,
        })
    }
}

/// How to fault a fresh pool in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Populate {
    /// The C reference: one `madvise(MADV_POPULATE_WRITE)` per thread.
    RawC,
    /// The engine ([`prefault::run`]) with this method.
    Engine(PrefaultChoice),
}

/// One timed prefault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// The time of the prefault alone.
    pub took: Duration,
    /// Threads that did the work (the engine never splits a page, so a pool
    /// of fewer pages than threads uses fewer).
    pub threads: usize,
    /// Whether the engine fell back from populate-write to touch.
    pub fell_back: bool,
}

/// Prefault the region with exactly `threads` threads (whatever the engine's
/// per-thread minimum says); returns the time of the prefault alone.
///
/// # Errors
/// The prefault's error.
pub fn prefault_region(region: &Region<'_>, how: Populate, threads: usize) -> Result<Timed> {
    match how {
        Populate::RawC => {
            let start = Instant::now();
            raw_populate(region, threads).map_err(|source| {
                Error::os(
                    "madvise(MADV_POPULATE_WRITE) (C reference)",
                    source,
                    Context::new(region.mapped_len(), region.page())
                        .addr(region.addr() as usize)
                        .remedy("the kernel refused to fault the pages in; check free memory"),
                )
            })?;
            Ok(Timed {
                took: start.elapsed(),
                threads,
                fell_back: false,
            })
        }
        Populate::Engine(choice) => {
            let mut plan = prefault::plan(
                choice,
                Extent {
                    offset: 0,
                    len: region.mapped_len(),
                },
                region.page(),
                NonZeroUsize::new(threads),
            )?;
            plan.threads = threads;
            let start = Instant::now();
            let outcome = prefault::run(
                region,
                &plan,
                &|done| {
                    black_box(done);
                },
                &pool_core::interrupt::Cancel::new(),
            )?;
            Ok(Timed {
                took: start.elapsed(),
                threads: outcome.threads,
                fell_back: outcome.fell_back_to_touch,
            })
        }
    }
}

/// Build a fresh pool of `plan`, prefault it with `how` on `threads` threads,
/// tear it down; returns the time of the prefault alone.
///
/// # Errors
/// The build's, the prefault's or the teardown's error.
pub fn prefault_once(plan: &PoolPlan, how: Populate, threads: usize) -> Result<Timed> {
    let pool = FreshPool::build(plan)?;
    let timed = prefault_region(black_box(&pool.region()), how, threads)?;
    pool.teardown()?;
    Ok(timed)
}

/// Build, fill with `memset` on `threads` threads and tear down a pool of
/// `plan`, so later measurements do not pay for the host handing memory back
/// to a VM on first touch (0.6–1.9 s/GiB on the CI machines). Returns how
/// long it took.
///
/// # Errors
/// The build's, the fill's or the teardown's error.
pub fn warm_up(plan: &PoolPlan, threads: usize) -> Result<Duration> {
    let start = Instant::now();
    let mut pool = FreshPool::build(plan)?;
    let size = pool.region().mapped_len();
    let page = pool.region().page();
    pool.memset(threads).map_err(|source| {
        Error::os(
            "memset (warm-up)",
            source,
            Context::new(size, page).remedy("could not start the threads"),
        )
    })?;
    pool.teardown()?;
    Ok(start.elapsed())
}

/// One `mmap(MAP_POPULATE)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapPopulated {
    /// From the `mmap` call to its return.
    pub took: Duration,
    /// Bytes present in the mapping afterwards (from /proc/self/smaps), when
    /// readable: `MAP_POPULATE` is best effort and fails silently.
    pub present: Option<u64>,
}

/// Map `size` bytes of `memory` with `MAP_POPULATE`, timing the `mmap` alone:
/// a private anonymous mapping for `anon`, a `MAP_SHARED` mapping of an
/// `O_TMPFILE` in /dev/shm for `shm-segmented` (one file), of a hugetlb memfd
/// for `hugetlbfs`. The file is made before the clock starts; the mapping is
/// unmapped and the file closed after it stops.
///
/// # Errors
/// The file's creation error, or [`Error::Os`] with the `mmap` errno (for
/// huge pages, `ENOMEM` when too few are free).
pub fn map_populate_once(memory: &Memory, size: u64) -> Result<MapPopulated> {
    let len =
        usize::try_from(size).map_err(|_| Error::config("size larger than the address space"))?;
    let fd: Option<OwnedFd> = match memory.backing {
        "anon" => None,
        "hugetlbfs" => Some(file::create_memfd(
            "hostpool-bench",
            size,
            memory.page,
            true,
        )?),
        _ => Some(file::create_private(
            Path::new("/dev/shm"),
            size,
            memory.page,
        )?),
    };
    let start = Instant::now();
    let map = crate::sys::map_populated(len, fd.as_ref().map(AsFd::as_fd));
    let took = start.elapsed();
    let map = map.map_err(|source| {
        Error::os(
            "mmap(MAP_POPULATE)",
            source,
            Context::new(size, memory.page).remedy("free memory, or free huge pages of the size"),
        )
    })?;
    let present = smaps_bytes(map.as_ptr() as usize, &PRESENT_FIELDS);
    drop(map);
    drop(fd);
    Ok(MapPopulated { took, present })
}

/// The /proc/self/smaps fields that together count a mapping's present
/// bytes: `Rss`, and the hugetlb fields, which `Rss` does not count.
pub const PRESENT_FIELDS: [&str; 3] = ["Rss", "Shared_Hugetlb", "Private_Hugetlb"];

/// The sum of `fields` (in bytes) of the mapping of this process that starts
/// at `addr`, from /proc/self/smaps; `None` when unreadable or not found.
pub fn smaps_bytes(addr: usize, fields: &[&str]) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let start = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
    lines.next()?;
    let mut kib = 0;
    for line in lines {
        let Some((key, rest)) = line.split_once(':') else {
            break;
        };
        if key.contains(' ') || key.contains('-') {
            break; // the next mapping's header
        }
        if fields.contains(&key) {
            kib += rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?;
        }
    }
    Some(kib * KIB)
}

#[cfg(test)]
mod tests {
    // The tests plan pools of the `anon` backing.
    use backing_anon as _;

    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn raw_c_threads_never_split_a_huge_page() {
        // One 1 GiB page cannot be split between two threads.
        assert!(!raw_c_slices_aligned(GIB, PageSize::HUGE_1G, 2));
        assert_eq!(raw_c_threads(GIB, PageSize::HUGE_1G, 2), 1);
        assert_eq!(raw_c_threads(2 * GIB, PageSize::HUGE_1G, 2), 2);
        assert_eq!(raw_c_threads(64 * MIB, PageSize::BASE_4K, 8), 8);
        // 3 × 2 MiB over 2 threads: 4 KiB-even slices start mid-page.
        assert_eq!(raw_c_threads(6 * MIB, PageSize::HUGE_2M, 2), 1);
    }

    #[test]
    fn sizes_round_to_the_page_and_2_mib() {
        assert_eq!(ANON_4K.round(MIB + 1), 2 * MIB);
        assert_eq!(HUGETLB_2M.round(3 * MIB), 4 * MIB);
        assert_eq!(HUGETLB_1G.round(32 * MIB), GIB);
    }

    #[test]
    fn map_populate_makes_anonymous_memory_present() {
        let size = 8 * MIB;
        let m = map_populate_once(&ANON_4K, size).unwrap();
        if let Some(p) = m.present {
            assert_eq!(p, size);
        }
    }

    #[test]
    fn map_populate_of_shm_leaves_no_file() {
        let size = 4 * MIB;
        let m = map_populate_once(&SHM_4K, size).unwrap();
        if let Some(p) = m.present {
            assert_eq!(p, size);
        }
    }

    #[test]
    fn prefault_once_with_every_method() {
        let plan = ANON_4K.plan(8 * MIB).unwrap();
        for how in [
            Populate::RawC,
            Populate::Engine(PrefaultChoice::PopulateWrite),
            Populate::Engine(PrefaultChoice::Touch),
        ] {
            let t = prefault_once(&plan, how, 2).unwrap();
            assert_eq!(t.threads, 2, "{how:?}");
            assert!(!t.fell_back);
        }
        warm_up(&plan, 2).unwrap();
    }
}
