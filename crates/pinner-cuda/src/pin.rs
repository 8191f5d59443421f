//! Pinning: registered chunks, all or nothing, and the live pin.

use std::time::Instant;

use pool_core::host::memlock;
use pool_core::plugin::PinContext;
use pool_core::plugin::{Pin, Pinner};
use pool_core::{Error, Region, Result, TeardownIssue};
use pool_core::{Extent, format_bytes, registration_chunks};
use serde::Serialize;
use serde_json::{Value, json};

use crate::probe::{describe, driver, panicked};
use crate::session::Session;
use crate::sys::{self, Api, Status};
use crate::{CudaPinner, NAME};

/// One registered chunk, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ChunkReport {
    /// Offset from the start of the pinned region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Seconds `cuMemHostRegister` took.
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunk {
    pub(crate) index: usize,
    pub(crate) addr: usize,
    pub(crate) report: ChunkReport,
}

/// Registered chunks; unregisters them in reverse when dropped while armed
/// (an unwinding panic), so nothing stays pinned behind an error.
#[derive(Debug)]
pub(crate) struct Registered<'s> {
    pub(crate) session: &'s Session,
    pub(crate) chunks: Vec<Chunk>,
}

impl Registered<'_> {
    /// Unregister every chunk in reverse; the failures, in words.
    pub(crate) fn rollback(&mut self) -> Vec<String> {
        let api = self.session.api;
        let mut failures = Vec::new();
        while let Some(c) = self.chunks.pop() {
            if let Err(s) = api.unregister(c.addr) {
                failures.push(format!(
                    "chunk {} (offset {}, {}) at {:#x}: {}",
                    c.index,
                    format_bytes(c.report.offset),
                    format_bytes(c.report.len),
                    c.addr,
                    api.error_name(s)
                ));
            }
        }
        failures
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        for f in self.rollback() {
            tracing::warn!("cuda pinner could not unregister {f}");
        }
    }
}

/// Why a registration failed and what to do, by driver status.
pub(crate) fn register_hint(status: Status) -> &'static str {
    match status {
        1 => {
            "the driver refused the call: a chunk too large for it (drivers from R580 reject 512 GiB \
             or more at once) or a memlock limit; lower [cuda] chunk_size, or raise the memlock \
             limit (`ulimit -l unlimited`, Docker `--ulimit memlock=-1`)"
        }
        2 => {
            "the driver could not pin more memory: check the memlock limit (`ulimit -l`, Docker \
             `--ulimit memlock=-1`, `LimitMEMLOCK=infinity`) and free memory, or pin a smaller pool"
        }
        712 => "part of the range is already registered: is another pin of this pool live?",
        _ => "see the driver's message",
    }
}

impl Pinner for CudaPinner {
    fn plan(&self, size: pool_core::MappedSize, ctx: &PinContext) -> serde_json::Value {
        let block = ctx.block(size.page());
        match pool_core::registration_chunks(
            size.mapped(),
            size.page(),
            block,
            self.options.chunk_size.get(),
        ) {
            Ok(chunks) => serde_json::json!({
                "device": self.options.device,
                "chunk_size": self.options.chunk_size.get(),
                "block": block,
                "chunks": chunks.iter().map(|c| serde_json::json!({"offset": c.offset, "len": c.len})).collect::<Vec<_>>(),
            }),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        }
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn pin(&self, region: Region<'_>, ctx: &PinContext) -> Result<Box<dyn Pin>> {
        sys::guarded(|| self.pin_inner(region, ctx))
            .unwrap_or_else(|msg| Err(panicked("cuda pinner", &msg)))
    }
}

impl CudaPinner {
    pub(crate) fn pin_inner(&self, region: Region<'_>, ctx: &PinContext) -> Result<Box<dyn Pin>> {
        const WHAT: &str = "cuda pinner";
        let api = driver(WHAT)?;
        let len = region.mapped_len();
        let memlock = memlock::check(len, NAME, region.is_hugetlb(), ctx.memlock_bound)?;
        let block = ctx.block(region.page());
        let extents =
            registration_chunks(len, region.page(), block, self.options.chunk_size.get())?;
        let flags = self.options.flag_bits();
        let session = Session::open(api, WHAT, self.options.device)?;

        let started = Instant::now();
        let mut registered = Registered {
            session: &session,
            chunks: Vec::with_capacity(extents.len()),
        };
        for (index, &extent) in extents.iter().enumerate() {
            let addr = region
                .at(extent.offset)
                .map_or(0, |p| p.expose_provenance());
            let t = Instant::now();
            match api.register(&region, extent, flags) {
                Ok(()) => registered.chunks.push(Chunk {
                    index,
                    addr,
                    report: ChunkReport {
                        offset: extent.offset,
                        len: extent.len,
                        seconds: t.elapsed().as_secs_f64(),
                    },
                }),
                Err(status) => {
                    let failures = registered.rollback();
                    drop(registered);
                    session.restore();
                    let closed = session.close().err();
                    return Err(register_error(RegisterFailure {
                        api,
                        session: &session,
                        index,
                        count: extents.len(),
                        extent,
                        addr,
                        status,
                        rollback_failures: failures,
                        close_failure: closed,
                    }));
                }
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let chunks = std::mem::take(&mut registered.chunks);
        drop(registered);
        session.restore();
        let gib = len as f64 / f64::from(1u32 << 30);
        tracing::info!(
            "pinned {} on CUDA device {} in {} chunks, {seconds:.3} s",
            format_bytes(len),
            session.index,
            chunks.len()
        );
        let details = json!({
            "device": session.index,
            "device_name": session.name,
            "driver_version": session.driver_version,
            "flags": self.options.flags,
            "flags_value": flags,
            "address": format!("{:#x}", region.addr().addr()),
            "bytes": len,
            "block": block,
            "chunk_size": self.options.chunk_size.get(),
            "chunks": chunks.iter().map(|c| c.report).collect::<Vec<_>>(),
            "seconds": seconds,
            "seconds_per_gib": if gib > 0.0 { seconds / gib } else { 0.0 },
            "memlock": memlock,
        });
        Ok(Box::new(CudaPin {
            live: Some(LivePin { session, chunks }),
            details,
        }))
    }
}

pub(crate) struct RegisterFailure<'a> {
    pub(crate) api: &'a Api,
    pub(crate) session: &'a Session,
    pub(crate) index: usize,
    pub(crate) count: usize,
    pub(crate) extent: Extent,
    pub(crate) addr: usize,
    pub(crate) status: Status,
    pub(crate) rollback_failures: Vec<String>,
    pub(crate) close_failure: Option<String>,
}

pub(crate) fn register_error(f: RegisterFailure<'_>) -> Error {
    let undone = match (f.index, f.rollback_failures.is_empty()) {
        (0, _) => "no earlier chunk was registered".to_string(),
        (1, true) => "chunk 0 was unregistered, nothing stays pinned".to_string(),
        (i, true) => format!(
            "the {i} chunks before it (0 to {}) were unregistered in reverse, nothing stays pinned",
            i - 1
        ),
        (_, false) => format!(
            "rolling back, cuMemHostUnregister failed for {}; those pages stay pinned until the \
             process exits",
            f.rollback_failures.join(", ")
        ),
    };
    let mut message = format!(
        "cuMemHostRegister of chunk {} (offset {}, {}) failed: {}; the chunk starts at {:#x}, \
         the pool has {} chunks (numbered from 0), device {} ({}); {undone}; {}",
        f.index,
        format_bytes(f.extent.offset),
        format_bytes(f.extent.len),
        describe(f.api, f.status),
        f.addr,
        f.count,
        f.session.index,
        f.session.name,
        register_hint(f.status),
    );
    if let Some(c) = f.close_failure {
        message.push_str(&format!("; also {c}"));
    }
    Error::Plugin {
        what: "cuda pinner".into(),
        message,
        source: None,
    }
}

/// What is pinned: the session and the chunks in registration order.
#[derive(Debug)]
pub(crate) struct LivePin {
    pub(crate) session: Session,
    pub(crate) chunks: Vec<Chunk>,
}

impl LivePin {
    /// Unregister in reverse (with the context current on this thread,
    /// which may not be the one that pinned, and the thread's own context
    /// put back afterwards), then release the context.
    pub(crate) fn release(self) -> Vec<TeardownIssue> {
        let api = self.session.api;
        let dev = self.session.index;
        let mut issues = Vec::new();
        let previous = api.current().ok();
        if let Err(s) = api.set_current(self.session.ctx) {
            issues.push(TeardownIssue::log(
                "cuCtxSetCurrent",
                format!("device {dev}: {}; unregistering anyway", describe(api, s)),
            ));
        }
        for c in self.chunks.iter().rev() {
            if let Err(s) = api.unregister(c.addr) {
                issues.push(TeardownIssue::log(
                    "cuMemHostUnregister",
                    format!(
                        "chunk {} (offset {}, {}) at {:#x} on device {dev}: {}",
                        c.index,
                        format_bytes(c.report.offset),
                        format_bytes(c.report.len),
                        c.addr,
                        describe(api, s)
                    ),
                ));
            }
        }
        if let Some(previous) = previous
            && let Err(s) = api.set_current(previous)
        {
            tracing::warn!(
                "cuda pinner could not restore the thread's CUDA context: {}",
                describe(api, s)
            );
        }
        if let Err(e) = self.session.close() {
            issues.push(TeardownIssue::log("cuDevicePrimaryCtxRelease", e));
        }
        issues
    }
}

/// A live CUDA pin. [`Pin::unpin`] releases it; so does dropping it, as a
/// fallback (issues are then only logged).
#[derive(Debug)]
pub struct CudaPin {
    pub(crate) live: Option<LivePin>,
    pub(crate) details: Value,
}

impl CudaPin {
    pub(crate) fn release(&mut self) -> Vec<TeardownIssue> {
        let Some(live) = self.live.take() else {
            return Vec::new();
        };
        sys::guarded(|| live.release()).unwrap_or_else(|msg| {
            vec![TeardownIssue::log(
                "cuMemHostUnregister",
                format!("the CUDA driver binding panicked ({msg}); some chunks may stay pinned"),
            )]
        })
    }
}

impl Pin for CudaPin {
    fn details(&self) -> Value {
        self.details.clone()
    }

    fn unpin(mut self: Box<Self>) -> Vec<TeardownIssue> {
        self.release()
    }
}

impl Drop for CudaPin {
    fn drop(&mut self) {
        // Issues are logged by TeardownIssue::log.
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_names_chunk_offset_size_and_driver_error() {
        let hint = register_hint(2);
        assert!(hint.contains("ulimit -l"));
        assert!(register_hint(1).contains("chunk_size"));
    }
}
