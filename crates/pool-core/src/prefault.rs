//! The prefault engine: make every page of a pool resident before it is
//! pinned or handed out.
//!
//! `madvise(MADV_POPULATE_WRITE)` is the kernel's own path (Linux 5.14); it is
//! probed once per process. Only when a call returns `EINVAL` (an older kernel,
//! or a mapping type it cannot populate) does a range fall back to touching one
//! byte per page; every other errno fails the prefault with the range.
//!
//! Threads: each takes a page-aligned, disjoint slice from
//! [`crate::layout::shards`]; all start together behind a barrier (so thread
//! start-up does not contend with the first faults on the mm lock); each gets
//! at least [`MIN_BYTES_PER_THREAD`], and no more threads than
//! `available_parallelism` unless asked.

use std::io;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use enum_dispatch::enum_dispatch;
use serde::Serialize;

use crate::config::PrefaultChoice;
use crate::error::{Context, Error, Result};
use crate::interrupt::Cancel;
use crate::layout::{Extent, PageSize, format_bytes, shards};
use crate::sys;
use crate::sys::Region;

/// Each prefault thread gets at least this much: below it, thread start-up
/// and mm-lock contention cost more than the parallel faults save
/// (cloud-hypervisor's comment gives 64 MiB; `thread_count` tests hold it).
pub const MIN_BYTES_PER_THREAD: u64 = 64 << 20;

/// Work is handed to the kernel in steps of about this size, so progress is
/// reported and an abort is noticed between steps. One `madvise` per 256 MiB
/// costs nothing measurable next to faulting 65536 pages.
pub const STEP_BYTES: u64 = 256 << 20;

/// One way of faulting pages in.
#[enum_dispatch]
pub trait FaultIn {
    /// The method's name in reports and config.
    fn name(&self) -> &'static str;

    /// Fault `extent` of `region` in for writing.
    ///
    /// # Errors
    /// The errno of the underlying call.
    fn fault(&self, region: &Region<'_>, extent: Extent) -> io::Result<()>;
}

/// `madvise(MADV_POPULATE_WRITE)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PopulateWrite;

/// Touch one byte per page with an atomic read-modify-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch;

/// Do nothing: pages fault on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoPrefault;

impl FaultIn for PopulateWrite {
    fn name(&self) -> &'static str {
        "populate-write"
    }

    fn fault(&self, region: &Region<'_>, extent: Extent) -> io::Result<()> {
        region.populate_write(extent)
    }
}

impl FaultIn for Touch {
    fn name(&self) -> &'static str {
        "touch"
    }

    fn fault(&self, region: &Region<'_>, extent: Extent) -> io::Result<()> {
        // Touch every base page: a huge page is faulted by its first touch and
        // the rest cost a cache miss each, but base-page stride is right for
        // every mapping kind.
        let stride = sys::base_page_size().min(region.page().get() as usize);
        region.touch(extent, stride)
    }
}

impl FaultIn for NoPrefault {
    fn name(&self) -> &'static str {
        "none"
    }

    fn fault(&self, _: &Region<'_>, _: Extent) -> io::Result<()> {
        Ok(())
    }
}

/// The closed set of prefault methods.
#[enum_dispatch(FaultIn)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefaultMethod {
    /// `madvise(MADV_POPULATE_WRITE)`.
    PopulateWrite,
    /// One atomic read-modify-write per page.
    Touch,
    /// Nothing.
    NoPrefault,
}

/// How a pool will be prefaulted: resolved, with the reasons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefaultPlan {
    /// The method.
    pub method: PrefaultMethod,
    /// Worker threads.
    pub threads: usize,
    /// The part of the mapping to fault (all of it for a private pool; this
    /// rank's shard for a shared one).
    pub extent: Extent,
    /// Why this method and this many threads, one line each.
    pub explain: Vec<String>,
}

/// How many threads to prefault `len` bytes with: `requested`, else
/// `available`, but never so many that a thread gets less than
/// [`MIN_BYTES_PER_THREAD`], and at least one.
pub fn thread_count(len: u64, requested: Option<NonZeroUsize>, available: usize) -> usize {
    let ceiling = requested.map_or(available, NonZeroUsize::get).max(1);
    let by_size = usize::try_from(len / MIN_BYTES_PER_THREAD).unwrap_or(usize::MAX);
    ceiling.min(by_size).max(1)
}

/// Resolve a prefault choice for `extent` of a mapping with `page`-sized pages.
///
/// # Errors
/// [`Error::NotAvailable`] when `populate-write` is asked for on a kernel
/// without it (the probe got `EINVAL`); [`Error::Os`] when the probe failed
/// with any other errno, for `auto` and `populate-write` alike.
pub fn plan(
    choice: PrefaultChoice,
    extent: Extent,
    page: PageSize,
    requested_threads: Option<NonZeroUsize>,
) -> Result<PrefaultPlan> {
    let available = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let supported = || {
        sys::populate_write_probe().map_err(|e| {
            Error::os(
                "madvise(MADV_POPULATE_WRITE) probe",
                e,
                Context::new(sys::base_page_size() as u64, PageSize::BASE_4K).remedy(
                    "probing the kernel's populate call failed with an error other than EINVAL \
                     (which alone means the kernel lacks it); check dmesg for memory errors, or \
                     set prefault = \"touch\" to bypass the call",
                ),
            )
        })
    };
    let (method, why) = match choice {
        PrefaultChoice::Auto if supported()? => (
            PrefaultMethod::from(PopulateWrite),
            "prefault auto: the kernel has MADV_POPULATE_WRITE (probed)",
        ),
        PrefaultChoice::Auto => (
            PrefaultMethod::from(Touch),
            "prefault auto: the kernel lacks MADV_POPULATE_WRITE (needs Linux 5.14), so touch one byte per page",
        ),
        PrefaultChoice::PopulateWrite if supported()? => (
            PopulateWrite.into(),
            "prefault populate-write was asked for",
        ),
        PrefaultChoice::PopulateWrite => {
            return Err(Error::NotAvailable {
                what: "prefault populate-write".into(),
                reason: "the kernel lacks MADV_POPULATE_WRITE (Linux 5.14+, the probe got EINVAL); use prefault = \"auto\" or \"touch\"".into(),
            });
        }
        PrefaultChoice::Touch => (Touch.into(), "prefault touch was asked for"),
        PrefaultChoice::None => (
            NoPrefault.into(),
            "prefault none: pages fault on first use (a GPU driver pinning them then faults them one by one)",
        ),
    };
    // Never more threads than pages: one 1 GiB page is one thread's work.
    let pages = usize::try_from(page.pages(extent.len))
        .unwrap_or(usize::MAX)
        .max(1);
    let threads = match method {
        PrefaultMethod::NoPrefault(_) => 1,
        _ => thread_count(extent.len, requested_threads, available).min(pages),
    };
    let thread_why = format!(
        "{threads} prefault thread(s): {} ceiling, at least {} each over {}",
        match requested_threads {
            Some(n) => format!("{n} asked for"),
            None => format!("{available} available cores"),
        },
        format_bytes(MIN_BYTES_PER_THREAD),
        format_bytes(extent.len),
    );
    Ok(PrefaultPlan {
        method,
        threads,
        extent,
        explain: vec![why.to_string(), thread_why],
    })
}

/// What a prefault did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefaultOutcome {
    /// The method used ("populate-write", "touch" or "none").
    pub method: &'static str,
    /// Threads used.
    pub threads: usize,
    /// Bytes faulted.
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Whether some range fell back from populate-write to touch on `EINVAL`.
    pub fell_back_to_touch: bool,
    /// Each thread's slice and when it started and ended faulting it, in
    /// seconds from the phase's start: where the phase's time went.
    pub per_thread: Vec<ThreadTiming>,
}

/// One prefault thread's share of the phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadTiming {
    /// Bytes this thread faulted.
    pub bytes: u64,
    /// Seconds from the phase's start until this thread began faulting
    /// (thread start and the barrier release).
    pub start: f64,
    /// Seconds from the phase's start until this thread's last step ended.
    pub end: f64,
}

/// Zero `plan`'s extent of `region` in place, on as many threads as the
/// prefault plan has: what a keeper does between leases. Its pages stay
/// resident and allocated, so the next lease finds them as the prefault
/// left them, and no other process can take them meanwhile.
///
/// It goes 64 MiB at a time per thread and stops early, returning
/// `Ok(false)`, once `stop` says so (a keeper told to stop at once).
///
/// # Errors
/// [`Error::Config`] for an extent outside the region.
pub fn zero(
    region: &Region<'_>,
    plan: &PrefaultPlan,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<bool> {
    let (mut slices, tail) = thread_slices(region, plan, "zeroing")?;
    match slices.last_mut() {
        Some(last) => last.len += tail,
        None => slices.push(plan.extent),
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = slices
            .iter()
            .map(|slice| s.spawn(move || zero_slice(region, *slice, stop)))
            .collect();
        let mut whole = true;
        for h in handles {
            match h.join() {
                Ok(r) => {
                    whole &= r.map_err(|e| {
                        Error::os(
                            "zeroing",
                            e,
                            Context::new(plan.extent.len, region.page())
                                .remedy("a bug: the range was checked"),
                        )
                    })?;
                }
                Err(_) => return Err(Error::config("a zeroing thread panicked")),
            }
        }
        Ok(whole)
    })
}

/// Zero one thread's slice in steps of [`MIN_BYTES_PER_THREAD`], asking
/// `stop` before each; `false` if it stopped early.
fn zero_slice(
    region: &Region<'_>,
    slice: Extent,
    stop: &(dyn Fn() -> bool + Sync),
) -> io::Result<bool> {
    let mut offset = slice.offset;
    while offset < slice.end() {
        // Tests slow each step down to stop a keeper mid-clearing.
        crate::failpoint::delay("HOSTPOOL_FAILPOINT_ZERO_STEP_MS");
        if stop() {
            return Ok(false);
        }
        let len = (slice.end() - offset).min(MIN_BYTES_PER_THREAD);
        region.zero(Extent { offset, len })?;
        offset += len;
    }
    Ok(true)
}

/// `plan.extent` of `region` split among `plan.threads` threads, whole
/// pages each, and the tail past its last whole page (a rank's shard that
/// is not a page multiple), which the last slice takes.
///
/// # Errors
/// [`Error::Config`] for an extent outside the region or off a page
/// boundary, saying it was for `what`.
fn thread_slices(
    region: &Region<'_>,
    plan: &PrefaultPlan,
    what: &str,
) -> Result<(Vec<Extent>, u64)> {
    let page = region.page();
    if plan.extent.end() > region.mapped_len() || !page.is_aligned(plan.extent.offset) {
        return Err(Error::config(format!(
            "{what} range {}+{} is outside the {} mapping or not aligned to its {page} pages",
            plan.extent.offset,
            plan.extent.len,
            format_bytes(region.mapped_len())
        )));
    }
    let threads = u32::try_from(plan.threads.max(1)).unwrap_or(u32::MAX);
    let slices = shards(page.round_down(plan.extent.len), page, threads)?
        .into_iter()
        .map(|s| Extent {
            offset: s.offset + plan.extent.offset,
            len: s.len,
        })
        .collect();
    Ok((slices, plan.extent.len - page.round_down(plan.extent.len)))
}

/// Fault `plan.extent` of `region` in with `plan.threads` threads, calling
/// `progress` with the total bytes done after each step (from any thread).
/// Each thread checks `cancel` before each step.
///
/// # Errors
/// [`Error::Os`] naming the call, the failing range and the remedy; the first
/// error stops the other threads at their next step;
/// [`Error::Interrupted`] once `cancel` is cancelled.
pub fn run(
    region: &Region<'_>,
    plan: &PrefaultPlan,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &Cancel,
) -> Result<PrefaultOutcome> {
    let page = region.page();
    // A shard extent that is not a page multiple (a rank's tail) keeps its
    // last partial page in the last slice.
    let (slices, tail) = thread_slices(region, plan, "prefault")?;
    let worker = Worker {
        region,
        method: plan.method,
        page,
        done: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        fell_back: AtomicBool::new(false),
        first_error: Mutex::new(None),
        progress,
        cancel,
        start: Instant::now(),
        timings: Mutex::new(Vec::with_capacity(slices.len())),
    };
    let start = worker.start;
    if slices.len() == 1 {
        worker.run(with_tail(slices[0], tail), None);
    } else {
        let barrier = Barrier::new(slices.len());
        let last = slices.len() - 1;
        std::thread::scope(|s| {
            for (i, slice) in slices.iter().enumerate() {
                let slice = if i == last {
                    with_tail(*slice, tail)
                } else {
                    *slice
                };
                let (worker, barrier) = (&worker, &barrier);
                s.spawn(move || worker.run(slice, Some(barrier)));
            }
        });
    }
    let seconds = start.elapsed().as_secs_f64();
    if let Some(e) = worker
        .first_error
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
    {
        return Err(e);
    }
    let mut per_thread = worker
        .timings
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    per_thread.sort_by(|a, b| a.start.total_cmp(&b.start));
    Ok(PrefaultOutcome {
        method: plan.method.name(),
        threads: slices.len(),
        bytes: worker.done.load(Ordering::Relaxed),
        seconds,
        fell_back_to_touch: worker.fell_back.load(Ordering::Relaxed),
        per_thread,
    })
}

/// What to do when a prefault call fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnError {
    /// `EINVAL` from populate-write: the kernel or mapping lacks it.
    FallBackToTouch,
    /// Interrupted: try the same range again (a bounded number of times).
    Retry,
    /// Anything else propagates with the range.
    Fail,
}

const MAX_RETRIES: u32 = 16;

fn on_error(method: &PrefaultMethod, errno: Option<i32>, retries: u32) -> OnError {
    match errno {
        Some(libc::EINVAL) if matches!(method, PrefaultMethod::PopulateWrite(_)) => {
            OnError::FallBackToTouch
        }
        Some(libc::EINTR | libc::EAGAIN) if retries < MAX_RETRIES => OnError::Retry,
        _ => OnError::Fail,
    }
}

fn with_tail(e: Extent, tail: u64) -> Extent {
    Extent {
        offset: e.offset,
        len: e.len + tail,
    }
}

struct Worker<'a> {
    region: &'a Region<'a>,
    method: PrefaultMethod,
    page: PageSize,
    done: AtomicU64,
    abort: AtomicBool,
    fell_back: AtomicBool,
    first_error: Mutex<Option<Error>>,
    progress: &'a (dyn Fn(u64) + Sync),
    cancel: &'a Cancel,
    start: Instant,
    timings: Mutex<Vec<ThreadTiming>>,
}

impl Worker<'_> {
    fn run(&self, slice: Extent, barrier: Option<&Barrier>) {
        if let Some(b) = barrier {
            b.wait();
        }
        let began = self.start.elapsed().as_secs_f64();
        let mut bytes = 0;
        self.fault_slice(slice, &mut bytes);
        let end = self.start.elapsed().as_secs_f64();
        self.timings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ThreadTiming {
                bytes,
                start: began,
                end,
            });
    }

    fn fault_slice(&self, slice: Extent, bytes: &mut u64) {
        let step = self.page.round_down(STEP_BYTES).max(self.page.get());
        let mut method = self.method;
        let mut offset = slice.offset;
        while offset < slice.end() && !self.abort.load(Ordering::Relaxed) {
            if let Err(e) = self.cancel.check() {
                self.abort.store(true, Ordering::Relaxed);
                let mut slot = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(e);
                return;
            }
            let len = step.min(slice.end() - offset);
            let extent = Extent { offset, len };
            match self.fault_step(&mut method, extent) {
                Ok(()) => {
                    *bytes += len;
                    let total = self.done.fetch_add(len, Ordering::Relaxed) + len;
                    (self.progress)(total);
                }
                Err(e) => {
                    self.abort.store(true, Ordering::Relaxed);
                    let mut slot = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert(e);
                    return;
                }
            }
            offset += len;
        }
    }

    fn fault_step(&self, method: &mut PrefaultMethod, extent: Extent) -> Result<()> {
        let mut retries = 0;
        loop {
            let Err(e) = method.fault(self.region, extent) else {
                return Ok(());
            };
            match on_error(method, e.raw_os_error(), retries) {
                OnError::FallBackToTouch => {
                    tracing::info!(
                        "MADV_POPULATE_WRITE returned EINVAL for this mapping; touching pages instead"
                    );
                    self.fell_back.store(true, Ordering::Relaxed);
                    *method = Touch.into();
                }
                OnError::Retry => retries += 1,
                OnError::Fail => return Err(self.error(method.name(), extent, e)),
            }
        }
    }

    fn error(&self, method: &'static str, extent: Extent, source: io::Error) -> Error {
        let remedy = match source.raw_os_error() {
            Some(libc::EFAULT) | Some(libc::EHWPOISON) => {
                "the backing could not supply a page: tmpfs or a hugetlbfs mount is full, huge pages \
                 ran short, or a hugetlb cgroup limit was hit; run `hostpool plan` for the capacity checks"
            }
            Some(libc::ENOMEM) => {
                "the node ran out of memory while faulting the pool; free memory or ask for a smaller --size"
            }
            _ => "see the error number below",
        };
        let op = if method == "touch" {
            "prefault (touch)"
        } else {
            "madvise(MADV_POPULATE_WRITE)"
        };
        let mut context = Context::new(extent.len, self.page)
            .remedy(format!("offset {} into the pool: {remedy}", extent.offset));
        if let Some(addr) = self.region.at(extent.offset) {
            context = context.addr(addr as usize);
        }
        Error::os(op, source, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::round_to_page;
    use crate::sys::{AnonMapOptions, Mmap, Reservation};

    fn nz(n: usize) -> Option<NonZeroUsize> {
        NonZeroUsize::new(n)
    }

    #[test]
    fn thread_count_gives_each_thread_at_least_64_mib() {
        let mib = 1u64 << 20;
        assert_eq!(thread_count(0, None, 16), 1);
        assert_eq!(thread_count(63 * mib, None, 16), 1);
        assert_eq!(thread_count(64 * mib, None, 16), 1);
        assert_eq!(thread_count(128 * mib, None, 16), 2);
        assert_eq!(thread_count(200 * mib, None, 16), 3);
        assert_eq!(thread_count(1 << 30, None, 16), 16);
        assert_eq!(thread_count(1 << 40, None, 16), 16);
        assert_eq!(thread_count(1 << 40, nz(4), 16), 4);
        assert_eq!(
            thread_count(1 << 40, nz(64), 16),
            64,
            "an explicit count may exceed the cores"
        );
        assert_eq!(
            thread_count(128 * mib, nz(64), 16),
            2,
            "but never below 64 MiB a thread"
        );
        assert_eq!(thread_count(u64::MAX, None, 0), 1);
    }

    fn with_mapping(len: usize, f: impl FnOnce(Region<'_>)) {
        let size = round_to_page(len as u64, PageSize::BASE_4K).unwrap();
        let m = Mmap::anonymous(
            size,
            AnonMapOptions {
                shared: false,
                align: 4096,
            },
        )
        .unwrap();
        f(m.region());
        m.unmap().unwrap();
    }

    fn resident(region: &Region<'_>) -> u64 {
        region.resident_pages().unwrap()
    }

    #[test]
    fn every_method_makes_the_whole_extent_resident_with_several_threads() {
        for choice in [
            PrefaultChoice::Auto,
            PrefaultChoice::PopulateWrite,
            PrefaultChoice::Touch,
        ] {
            with_mapping(200 << 20, |region| {
                let extent = Extent {
                    offset: 0,
                    len: region.mapped_len(),
                };
                let mut plan = plan(choice, extent, region.page(), nz(3)).unwrap();
                assert_eq!(plan.threads, 3);
                plan.threads = 3;
                let calls = AtomicU64::new(0);
                let last = AtomicU64::new(0);
                let out = run(
                    &region,
                    &plan,
                    &|done| {
                        calls.fetch_add(1, Ordering::Relaxed);
                        last.fetch_max(done, Ordering::Relaxed);
                    },
                    &Cancel::new(),
                )
                .unwrap();
                assert_eq!(out.bytes, 200 << 20);
                assert_eq!(out.threads, 3);
                assert_eq!(out.per_thread.len(), 3, "one timing per thread");
                assert_eq!(
                    out.per_thread.iter().map(|t| t.bytes).sum::<u64>(),
                    out.bytes,
                    "the threads' bytes add up to the phase's"
                );
                for t in &out.per_thread {
                    assert!(t.bytes > 0, "{t:?}");
                    assert!(
                        0.0 <= t.start && t.start <= t.end && t.end <= out.seconds,
                        "{t:?} lies outside the phase's {} s",
                        out.seconds
                    );
                }
                assert_eq!(
                    last.load(Ordering::Relaxed),
                    200 << 20,
                    "progress must reach the total"
                );
                assert!(calls.load(Ordering::Relaxed) >= 3);
                assert_eq!(
                    resident(&region),
                    (200 << 20) / 4096,
                    "{choice:?} left pages unfaulted"
                );
            });
        }
    }

    #[test]
    fn a_shard_faults_only_its_own_pages() {
        with_mapping(16 << 20, |region| {
            let extent = Extent {
                offset: 4 << 20,
                len: (4 << 20) + 4096,
            };
            let plan = plan(PrefaultChoice::Auto, extent, region.page(), None).unwrap();
            let out = run(&region, &plan, &|_| {}, &Cancel::new()).unwrap();
            assert_eq!(resident(&region), ((4 << 20) + 4096) / 4096);
            let bytes: Vec<u64> = out.per_thread.iter().map(|t| t.bytes).collect();
            assert_eq!(bytes, [(4 << 20) + 4096], "one thread, the tail included");
        });
    }

    #[test]
    fn never_more_threads_than_pages() {
        let one_page = Extent {
            offset: 0,
            len: 1 << 30,
        };
        let p = plan(PrefaultChoice::Auto, one_page, PageSize::HUGE_1G, nz(8)).unwrap();
        assert_eq!(p.threads, 1, "one 1 GiB page is one thread's work");
        let two = Extent {
            offset: 0,
            len: 2 << 30,
        };
        assert_eq!(
            plan(PrefaultChoice::Auto, two, PageSize::HUGE_1G, nz(8))
                .unwrap()
                .threads,
            2
        );
        assert_eq!(
            plan(PrefaultChoice::Auto, two, PageSize::BASE_4K, nz(8))
                .unwrap()
                .threads,
            8
        );
    }

    /// A cancelled token stops its prefault at the next step with
    /// `Interrupted`, having faulted at most a step per thread; a prefault
    /// with another token in the same process runs to its end.
    #[test]
    fn a_cancelled_token_stops_its_prefault_and_no_other() {
        // Two steps on one thread: the token is cancelled after the first.
        let len = 2 * STEP_BYTES;
        with_mapping(len as usize, |region| {
            let extent = Extent { offset: 0, len };
            let plan = plan(PrefaultChoice::Touch, extent, region.page(), nz(1)).unwrap();
            let cancel = Cancel::new();
            let other = Cancel::new();
            let done = AtomicU64::new(0);
            let e = run(
                &region,
                &plan,
                &|d| {
                    done.store(d, Ordering::Relaxed);
                    cancel.cancel(libc::SIGINT);
                },
                &cancel,
            )
            .unwrap_err();
            assert!(
                matches!(e, Error::Interrupted { signal } if signal == libc::SIGINT),
                "{e}"
            );
            assert_eq!(
                done.load(Ordering::Relaxed),
                STEP_BYTES,
                "stopped after one step"
            );
            let out = run(&region, &plan, &|_| {}, &other).unwrap();
            assert_eq!(out.bytes, len);
        });
    }

    #[test]
    fn none_faults_nothing() {
        with_mapping(8 << 20, |region| {
            let extent = Extent {
                offset: 0,
                len: region.mapped_len(),
            };
            let plan = plan(PrefaultChoice::None, extent, region.page(), None).unwrap();
            let out = run(&region, &plan, &|_| {}, &Cancel::new()).unwrap();
            assert_eq!(out.method, "none");
            assert_eq!(resident(&region), 0);
        });
    }

    #[test]
    fn zero_clears_every_byte_in_place_on_several_threads() {
        with_mapping(130 << 20, |region| {
            let whole = Extent {
                offset: 0,
                len: region.mapped_len(),
            };
            let plan = plan(PrefaultChoice::Auto, whole, region.page(), nz(3)).unwrap();
            run(&region, &plan, &|_| {}, &Cancel::new()).unwrap();
            region.write_pattern(4093, 7);
            let before = resident(&region);
            assert!(zero(&region, &plan, &|| false).unwrap());
            assert_eq!(resident(&region), before, "no page freed or added");
            let last = region.mapped_len() - 1;
            for off in (0..region.mapped_len()).step_by(4093).chain([last]) {
                assert_eq!(region.read_byte(off), Some(0), "offset {off}");
            }
            // A tail that is not a whole word, past a page boundary.
            region.write_pattern(1, 9);
            let odd = PrefaultPlan {
                extent: Extent {
                    offset: 4096,
                    len: 4096 + 5,
                },
                ..plan.clone()
            };
            assert!(zero(&region, &odd, &|| false).unwrap());
            assert_eq!(
                region.read_byte(4095),
                Some(crate::sys::pattern_byte(4095, 9))
            );
            assert!((4096..8197).all(|o| region.read_byte(o) == Some(0)));
            assert_eq!(
                region.read_byte(8197),
                Some(crate::sys::pattern_byte(8197, 9))
            );
            let outside = PrefaultPlan {
                extent: Extent {
                    offset: 0,
                    len: region.mapped_len() + 4096,
                },
                ..plan.clone()
            };
            assert!(matches!(
                zero(&region, &outside, &|| false),
                Err(Error::Config { .. })
            ));
            // Told to stop, it stops before the next step.
            region.write_byte(0, 1);
            assert!(!zero(&region, &plan, &|| true).unwrap());
            assert_eq!(region.read_byte(0), Some(1));
        });
    }

    #[test]
    fn out_of_range_extents_are_rejected() {
        with_mapping(1 << 20, |region| {
            let mut plan = plan(
                PrefaultChoice::Auto,
                Extent {
                    offset: 0,
                    len: 1 << 20,
                },
                region.page(),
                None,
            )
            .unwrap();
            plan.extent = Extent {
                offset: 0,
                len: 2 << 20,
            };
            assert!(matches!(
                run(&region, &plan, &|_| {}, &Cancel::new()),
                Err(Error::Config { .. })
            ));
            plan.extent = Extent {
                offset: 1,
                len: 4096,
            };
            assert!(matches!(
                run(&region, &plan, &|_| {}, &Cancel::new()),
                Err(Error::Config { .. })
            ));
        });
    }

    #[test]
    fn only_einval_from_populate_write_falls_back() {
        let pw = PrefaultMethod::from(PopulateWrite);
        let touch = PrefaultMethod::from(Touch);
        assert_eq!(
            on_error(&pw, Some(libc::EINVAL), 0),
            OnError::FallBackToTouch
        );
        assert_eq!(on_error(&touch, Some(libc::EINVAL), 0), OnError::Fail);
        for errno in [libc::EFAULT, libc::ENOMEM, libc::EPERM, libc::EHWPOISON] {
            assert_eq!(
                on_error(&pw, Some(errno), 0),
                OnError::Fail,
                "errno {errno}"
            );
        }
        assert_eq!(on_error(&pw, Some(libc::EINTR), 0), OnError::Retry);
        assert_eq!(
            on_error(&pw, Some(libc::EAGAIN), MAX_RETRIES),
            OnError::Fail
        );
        assert_eq!(on_error(&pw, None, 0), OnError::Fail);
    }

    #[test]
    fn populate_past_the_end_of_a_file_fails_with_efault_the_range_and_a_remedy() {
        // A shared file mapping longer than its 1 MiB file: the pages past EOF
        // would SIGBUS on access, so MADV_POPULATE_WRITE returns EFAULT, the
        // same errno as a full tmpfs. It must propagate, not fall back.
        let fd =
            rustix::fs::memfd_create("hostpool-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 1 << 20).unwrap();
        let len = 4usize << 20;
        let size = round_to_page(len as u64, PageSize::BASE_4K).unwrap();
        let mut r = Reservation::new(size).unwrap();
        r.map_file(
            Extent {
                offset: 0,
                len: len as u64,
            },
            rustix::fd::AsFd::as_fd(&fd),
        )
        .unwrap();
        let m = r.finish().unwrap();
        let region = m.region();
        let plan = plan(
            PrefaultChoice::PopulateWrite,
            Extent {
                offset: 0,
                len: len as u64,
            },
            region.page(),
            nz(1),
        )
        .unwrap();
        let e = run(&region, &plan, &|_| {}, &Cancel::new()).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EFAULT), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("MADV_POPULATE_WRITE")
                && msg.contains("offset 0")
                && msg.contains("hostpool plan"),
            "{msg}"
        );
        m.unmap().unwrap();
    }
}
