//! Pinning in the background: the pool is handed out once prefaulted, and a
//! thread pins it chunk by chunk, in address order, on block boundaries.
//!
//! The thread calls the pool's pinner once per chunk of at most
//! `background_chunk` bytes (whole blocks), keeping each chunk's pin, and
//! publishes its progress ([`PinProgress`]) after every chunk. It stops at a
//! failure: a required pin unpins what it pinned, last chunk first, and
//! reports `failed` with the error; a best-effort one keeps the pinned prefix
//! and reports `skipped` with the reason. Asked to stop (teardown), it ends
//! after the current chunk and hands back its pins, which the pool unpins in
//! reverse before it unmaps: memory is never unmapped under a running
//! pinning call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result, TeardownIssue};
use crate::layout::{self, Extent, format_bytes};
use crate::plugin::{Pin, PinContext, Pinner};
use crate::shared::Attachment;
use crate::sys::Region;

/// A pool's mapping and the background pin's thread, which runs on its
/// memory and returns the pins it made: the owner joins the thread before
/// the mapping goes.
pub(crate) type MappingOwner = crate::sys::Owner<Box<dyn Attachment>, Vec<Box<dyn Pin>>>;

/// The default chunk of a background pin.
pub const DEFAULT_CHUNK: u64 = 256 << 20;

/// Where a pin stands: the report's `pin.status`, and the `status` of
/// [`Pool::pin_status`](crate::Pool::pin_status) and the CLI's second report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PinStatus {
    /// No pinner asked for.
    Off,
    /// A background pin is running.
    Pinning,
    /// Everything asked for is pinned.
    Pinned,
    /// A required pin failed; nothing stays pinned.
    Failed,
    /// A best-effort pin did not (fully) happen (or stopped part way); what
    /// is pinned stays; the reason says why.
    Skipped,
}

/// A pin's progress (`Pool::pin_status`), written with its status twice,
/// as `status` and, as earlier releases wrote it, `state`.
#[derive(Debug, Clone, PartialEq)]
pub struct PinProgress {
    /// Where the pin stands.
    pub status: PinStatus,
    /// Bytes pinned so far.
    pub pinned_bytes: u64,
    /// Bytes to pin in all.
    pub total_bytes: u64,
    /// The pinned ranges, as offsets in the pool, in address order (merged).
    pub ranges: Vec<Extent>,
    /// Chunks pinned.
    pub chunks: usize,
    /// Why it failed or was skipped.
    pub error: Option<String>,
    /// Whether the pin runs (ran) in the background.
    pub background: bool,
    /// Whether a background pin is paused (`Pool::pause_pinning`): it pins
    /// no further chunk until resumed.
    pub paused: bool,
    /// Whether the pinning thread waits in the pause: the chunk that was in
    /// flight when it was paused is done (and counted), and nothing is
    /// pinned until it is resumed. What a caller that paused waits for.
    pub parked: bool,
    /// Seconds from the start of pinning to its end (so far, while pinning;
    /// time paused included).
    pub seconds: f64,
}

impl Serialize for PinProgress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("PinProgress", 11)?;
        out.serialize_field("status", &self.status)?;
        out.serialize_field("state", &self.status)?;
        out.serialize_field("pinned_bytes", &self.pinned_bytes)?;
        out.serialize_field("total_bytes", &self.total_bytes)?;
        out.serialize_field("ranges", &self.ranges)?;
        out.serialize_field("chunks", &self.chunks)?;
        out.serialize_field("error", &self.error)?;
        out.serialize_field("background", &self.background)?;
        out.serialize_field("paused", &self.paused)?;
        out.serialize_field("parked", &self.parked)?;
        out.serialize_field("seconds", &self.seconds)?;
        out.end()
    }
}

impl PinProgress {
    /// A pin that is over: `status`, with everything or nothing pinned.
    pub fn settled(
        status: PinStatus,
        extent: Option<Extent>,
        error: Option<String>,
        seconds: f64,
    ) -> PinProgress {
        let ranges: Vec<Extent> = match (status, extent) {
            (PinStatus::Pinned, Some(e)) if e.len > 0 => vec![e],
            _ => Vec::new(),
        };
        PinProgress {
            status,
            pinned_bytes: ranges.iter().map(|r| r.len).sum(),
            total_bytes: extent.map_or(0, |e| e.len),
            chunks: ranges.len(),
            ranges,
            error,
            background: false,
            paused: false,
            parked: false,
            seconds,
        }
    }
}

#[derive(Debug)]
struct Shared {
    stop: AtomicBool,
    progress: Mutex<PinProgress>,
    changed: Condvar,
    started: Instant,
}

impl Shared {
    /// Block while the pin is paused, until resumed or stopped.
    fn wait_while_paused(&self) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if p.paused {
            p.parked = true;
            self.changed.notify_all();
        }
        while p.paused && !self.stop.load(Ordering::SeqCst) {
            p = self
                .changed
                .wait_timeout(p, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        p.parked = false;
    }

    fn update(&self, f: impl FnOnce(&mut PinProgress)) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let was_pinning = p.status == PinStatus::Pinning;
        f(&mut p);
        // Only a running pin can be paused.
        p.paused &= p.status == PinStatus::Pinning;
        // The clock stops when the pin ends: a later pause or teardown does
        // not move it.
        if was_pinning {
            p.seconds = self.started.elapsed().as_secs_f64();
        }
        drop(p);
        self.changed.notify_all();
    }
}

/// A running (or finished) background pin.
#[derive(Debug)]
pub(crate) struct Background {
    shared: Arc<Shared>,
    /// The largest chunk it pins: `background_chunk` made whole units.
    chunk: u64,
}

/// The chunks of `extent` (offsets in the pool) a background pin takes: at
/// most `chunk` bytes each, but never less than one `lcm(page, block)` unit.
///
/// # Errors
/// [`Error::Layout`] for a block the layout cannot honour.
pub fn chunks(
    extent: Extent,
    page: crate::layout::PageSize,
    block: u64,
    chunk: u64,
) -> Result<Vec<Extent>> {
    if extent.len == 0 {
        return Ok(Vec::new());
    }
    // At least one whole unit (a 1 GiB page is never split).
    let unit = layout::lcm(page.get(), block.max(1)).unwrap_or(u64::MAX);
    let rel = layout::mr_regions(extent.len, page, block, chunk.max(unit))?;
    Ok(rel
        .into_iter()
        .map(|e| Extent {
            offset: extent.offset + e.offset,
            len: e.len,
        })
        .collect())
}

/// How a background pin runs, as the plan decided it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// The chunk asked for (rounded to whole pages and blocks).
    pub chunk: u64,
    /// Whether the chunk was given rather than defaulted.
    pub chunk_asked: bool,
    /// Whether a failure is the pin's error (else it is skipped).
    pub required: bool,
    /// The block and memlock policy.
    pub context: PinContext,
}

impl Background {
    /// Start pinning `extent` of the mapping `owner` owns with `pinner`, on
    /// a thread of the owner's (which joins it before the mapping goes). The
    /// pool stops it before it releases the mapping.
    pub(crate) fn start(
        owner: &mut MappingOwner,
        extent: Extent,
        pinner: Arc<dyn Pinner>,
        settings: Settings,
    ) -> Result<Background> {
        let page = owner.get().region().page();
        let block = settings.context.block(page);
        let chunk = settings.chunk;
        let parts = chunks(extent, page, block, chunk)?;
        let largest = parts.iter().map(|p| p.len).max().unwrap_or(0);
        if settings.chunk_asked && largest != chunk.min(extent.len) {
            tracing::info!(
                "pin.background_chunk {} pins in chunks of up to {}: whole {} pages and blocks",
                crate::layout::format_bytes(chunk),
                crate::layout::format_bytes(largest),
                crate::layout::format_bytes(page.get())
            );
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            progress: Mutex::new(PinProgress {
                status: PinStatus::Pinning,
                pinned_bytes: 0,
                total_bytes: extent.len,
                ranges: Vec::new(),
                chunks: 0,
                error: None,
                background: true,
                paused: false,
                parked: false,
                seconds: 0.0,
            }),
            changed: Condvar::new(),
            started: Instant::now(),
        });
        let ctx = settings.context;
        let required = settings.required;
        let thread_shared = Arc::clone(&shared);
        let name = format!("hostpool-pin-{}", pinner.name());
        owner
            .spawn(name, move |region| {
                run(&thread_shared, region, &parts, &*pinner, &ctx, required)
            })
            .map_err(|e| Error::Plugin {
                what: "background pinning".into(),
                message: "cannot start the pinning thread".into(),
                source: Some(Box::new(e)),
            })?;
        Ok(Background {
            shared,
            chunk: largest,
        })
    }

    /// The largest chunk it pins, in bytes.
    pub(crate) fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Pause (`true`) or resume (`false`) the pin between chunks: a chunk
    /// being pinned finishes first. Whether the pin was still running, so
    /// that pausing it means anything.
    pub(crate) fn pause(&self, paused: bool) -> bool {
        let mut running = false;
        self.shared.update(|p| {
            running = p.status == PinStatus::Pinning;
            p.paused = paused && running;
        });
        running
    }

    /// The progress so far.
    pub(crate) fn progress(&self) -> PinProgress {
        self.shared
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Wait until the pin is no longer `pinning`, or `timeout` passes, or
    /// `cancel` is cancelled; returns the progress then.
    pub(crate) fn wait(
        &self,
        timeout: Option<Duration>,
        cancel: Option<&crate::interrupt::Cancel>,
    ) -> PinProgress {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut p = self
            .shared
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while p.status == PinStatus::Pinning && cancel.is_none_or(|c| c.requested().is_none()) {
            let slice = Duration::from_millis(50);
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    left.min(slice)
                }
                None => slice,
            };
            p = self
                .shared
                .changed
                .wait_timeout(p, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        p.clone()
    }

    /// Stop after the current chunk, join the thread (on `owner`, the
    /// mapping's owner it runs on), and unpin what it pinned, last chunk
    /// first. Returns the final progress and what could not be undone.
    pub(crate) fn stop(self, owner: &mut MappingOwner) -> (PinProgress, Vec<TeardownIssue>) {
        self.request_stop();
        let pins = match owner.join() {
            Some(Ok(pins)) => pins,
            Some(Err(_)) => {
                return (
                    self.progress(),
                    vec![TeardownIssue::log(
                        "unpin",
                        "the background pinning thread panicked; what it pinned is released with the process",
                    )],
                );
            }
            None => Vec::new(),
        };
        let mut issues = Vec::new();
        for pin in pins.into_iter().rev() {
            issues.extend(pin.unpin());
        }
        (self.progress(), issues)
    }
}

impl Background {
    /// Ask the thread to stop after its current chunk (waking a paused
    /// pin: the lock orders the store before its next look at `stop`).
    fn request_stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        drop(self.shared.progress.lock());
        self.shared.changed.notify_all();
    }
}

impl Drop for Background {
    /// The thread stops soon: the mapping's owner joins it before the
    /// mapping goes.
    fn drop(&mut self) {
        self.request_stop();
    }
}

fn run(
    shared: &Shared,
    region: Region<'static>,
    parts: &[Extent],
    pinner: &dyn Pinner,
    ctx: &PinContext,
    required: bool,
) -> Vec<Box<dyn Pin>> {
    let mut pins: Vec<Box<dyn Pin>> = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        shared.wait_while_paused();
        if shared.stop.load(Ordering::SeqCst) {
            shared.update(|p| {
                if p.status == PinStatus::Pinning {
                    p.status = PinStatus::Skipped;
                    p.error =
                        Some("stopped: the pool was released while it was being pinned".into());
                }
            });
            return pins;
        }
        let Some(sub) = region.sub(*part) else {
            break;
        };
        match pinner.pin(sub, ctx) {
            Ok(pin) => {
                pins.push(pin);
                shared.update(|p| {
                    p.pinned_bytes += part.len;
                    p.chunks += 1;
                    match p.ranges.last_mut() {
                        Some(last) if last.offset + last.len == part.offset => last.len += part.len,
                        _ => p.ranges.push(*part),
                    }
                });
            }
            Err(e) => {
                let what = format!(
                    "background {} pin of chunk {i} of {} (offset {}, {}) failed: {e}",
                    pinner.name(),
                    parts.len(),
                    format_bytes(part.offset),
                    format_bytes(part.len)
                );
                if required {
                    let n = pins.len();
                    let mut issues = Vec::new();
                    for pin in pins.drain(..).rev() {
                        issues.extend(pin.unpin());
                    }
                    let undone = if issues.is_empty() {
                        format!("the {n} chunk(s) before it were unpinned in reverse")
                    } else {
                        format!("{} step(s) could not be undone", issues.len())
                    };
                    shared.update(|p| {
                        p.status = PinStatus::Failed;
                        p.pinned_bytes = 0;
                        p.ranges.clear();
                        p.chunks = 0;
                        p.error = Some(format!("{what}; {undone}"));
                    });
                } else {
                    tracing::warn!("{what}; the pinned prefix stays pinned, the rest pageable");
                    shared.update(|p| {
                        p.status = PinStatus::Skipped;
                        p.error = Some(format!(
                            "{what}; the first {} stay pinned",
                            format_bytes(p.pinned_bytes)
                        ));
                    });
                }
                return pins;
            }
        }
    }
    shared.update(|p| {
        if p.status == PinStatus::Pinning {
            p.status = PinStatus::Pinned;
        }
    });
    pins
}

/// The error a failed required background pin reports at `wait_pinned`.
pub(crate) fn failure(progress: &PinProgress, pinner: &str) -> Error {
    Error::Plugin {
        what: format!("{pinner} pinner"),
        message: progress
            .error
            .clone()
            .unwrap_or_else(|| "background pinning failed".into()),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PageSize;

    #[test]
    fn chunks_are_whole_blocks_in_address_order_and_never_split_a_page() {
        let e = Extent {
            offset: 8 << 20,
            len: 40 << 20,
        };
        let c = chunks(e, PageSize::BASE_4K, 4 << 20, 10 << 20).unwrap();
        assert_eq!(
            c.iter().map(|x| x.len).collect::<Vec<_>>(),
            [8 << 20, 8 << 20, 8 << 20, 8 << 20, 8 << 20]
        );
        assert!(c.windows(2).all(|w| w[0].offset + w[0].len == w[1].offset));
        assert_eq!(c[0].offset, 8 << 20);
        // A 1 GiB page is larger than the chunk: one page per chunk.
        let g = PageSize::new(1 << 30).unwrap();
        let c = chunks(
            Extent {
                offset: 0,
                len: 2 << 30,
            },
            g,
            1 << 30,
            256 << 20,
        )
        .unwrap();
        assert_eq!(c.len(), 2);
        assert!(
            chunks(Extent { offset: 0, len: 0 }, g, 1 << 30, 1)
                .unwrap()
                .is_empty()
        );
    }

    /// Blocks that are not page multiples (vLLM's 61 × 512 B, SGLang's
    /// 300 MiB on 2 MiB pages) pin in chunks cut on lcm(block, page).
    #[test]
    fn chunks_of_engine_blocks_are_cut_on_their_lcm_with_the_page() {
        let unit = 61 * 4096;
        let e = Extent {
            offset: 0,
            len: 16 << 20,
        };
        let c = chunks(e, PageSize::BASE_4K, 61 * 512, 1 << 20).unwrap();
        assert_eq!(c[0].len, 4 * unit, "floor(1 MiB / 244 KiB) units");
        assert_eq!(c.last().unwrap().offset + c.last().unwrap().len, 16 << 20);
        for x in &c[..c.len() - 1] {
            let b = x.offset + x.len;
            assert!(b % unit == 0 && b % (61 * 512) == 0 && b % 4096 == 0, "{b}");
        }
        // A chunk below one unit is one unit.
        let c = chunks(e, PageSize::BASE_4K, 61 * 512, 1).unwrap();
        assert!(c[..c.len() - 1].iter().all(|x| x.len == unit));
        let c = chunks(
            Extent {
                offset: 0,
                len: 1200 << 20,
            },
            PageSize::HUGE_2M,
            300 << 20,
            256 << 20,
        )
        .unwrap();
        assert_eq!(c.iter().map(|x| x.len).collect::<Vec<_>>(), [300 << 20; 4]);
    }
}
