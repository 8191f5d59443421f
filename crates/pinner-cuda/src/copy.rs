//! `verify_copy`: host → device → host from the pinned pool.

use pool_core::{Error, Result};
use pool_core::{Extent, format_bytes};
use serde::Serialize;

use crate::probe::{describe, driver, panicked};
use crate::session::Session;
use crate::sys::{self, Api, Status};

/// The outcome of [`verify_copy`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyReport {
    /// Device index.
    pub device: u32,
    /// Device name.
    pub device_name: String,
    /// Bytes copied each way.
    pub bytes: u64,
    /// Host to device, GiB/s (`cuMemcpyHtoD` and `cuCtxSynchronize`).
    pub h2d_gib_s: f64,
    /// Device to host, GiB/s (`cuMemcpyDtoH` and `cuCtxSynchronize`).
    pub d2h_gib_s: f64,
    /// Whether every byte came back as sent.
    pub verified: bool,
    /// The offset of the first byte that did not, if any.
    pub first_mismatch: Option<u64>,
}

/// Copy the first `bytes` of `region` host → device → host and check them:
/// backs `hostpool alloc --pin cuda --verify-copy`.
///
/// Writes a test pattern into the first `bytes` of the region, copies them
/// to a fresh device allocation (`cuMemAlloc_v2`, `cuMemcpyHtoD_v2`), zeroes
/// them, copies them back (`cuMemcpyDtoH_v2`) and compares; then frees the
/// device memory and releases the primary context it retained. The pattern
/// stays in the region. Bandwidths are those of pinned memory when the
/// region is pinned (pin it first with the `cuda` pinner; pageable memory
/// copies, more slowly, too). `verified = false` is a result, not an error:
/// the caller decides (the CLI should fail).
///
/// # Errors
/// [`Error::Config`] when `bytes` is 0 or more than `extent` holds, or when
/// `extent` is empty or not a page-aligned part of the pool (an empty shard
/// copies nothing); [`Error::NotAvailable`] without a driver or device (as
/// for pinning); [`Error::Plugin`] naming the driver call and error when a
/// call fails.
///
/// The `&mut Pool` is what makes the overwrite sound: nothing else in this
/// process can reach the pool's memory during the call. Peer ranks of a
/// shared pool are other processes: copy through this rank's own shard.
pub fn verify_copy(
    pool: &mut pool_core::Pool,
    extent: Extent,
    device: u32,
    bytes: u64,
) -> Result<CopyReport> {
    const WHAT: &str = "cuda copy check";
    let mut region = sys::Exclusive::new(pool, extent).ok_or_else(|| {
        Error::config(format!(
            "the copy check needs a non-empty, page-aligned part of a live pool, not {}+{}",
            extent.offset, extent.len
        ))
    })?;
    let mapped = region.region().mapped_len();
    if bytes == 0 || bytes > mapped {
        return Err(Error::config(format!(
            "the copy check needs between 1 byte and the {} it was given, not {}",
            format_bytes(mapped),
            format_bytes(bytes)
        )));
    }
    let len = usize::try_from(bytes)
        .map_err(|_| Error::config("the copy check size does not fit this platform"))?;
    let api = driver(WHAT)?;
    sys::guarded(|| copy_round_trip(api, &mut region, device, len))
        .unwrap_or_else(|msg| Err(panicked(WHAT, &msg)))
}

/// The body of [`verify_copy`]; `len <= region.mapped_len()`.
pub(crate) fn copy_round_trip(
    api: &'static Api,
    region: &mut sys::Exclusive<'_>,
    device: u32,
    len: usize,
) -> Result<CopyReport> {
    const WHAT: &str = "cuda copy check";
    let session = Session::open(api, WHAT, device)?;
    let fail = |call: &str, s: Status| Error::Plugin {
        what: WHAT.into(),
        message: format!(
            "{call} of {} on device {device} ({}) failed: {}",
            format_bytes(len as u64),
            session.name,
            describe(api, s)
        ),
        source: None,
    };
    let dptr = match api.mem_alloc(len) {
        Ok(d) => d,
        Err(s) => {
            let e = fail("cuMemAlloc", s);
            session.restore();
            let _ = session.close();
            return Err(e);
        }
    };
    let gib = len as f64 / f64::from(1u32 << 30);
    let outcome = api
        .round_trip(region, dptr, len)
        .map_err(|(call, s)| fail(call, s))
        .map(|rt| CopyReport {
            device,
            device_name: session.name.clone(),
            bytes: len as u64,
            h2d_gib_s: gib / rt.h2d_seconds.max(f64::MIN_POSITIVE),
            d2h_gib_s: gib / rt.d2h_seconds.max(f64::MIN_POSITIVE),
            verified: rt.first_mismatch.is_none(),
            first_mismatch: rt.first_mismatch,
        });
    let freed = api.mem_free(dptr);
    session.restore();
    let closed = session.close();
    let report = outcome?;
    freed.map_err(|s| fail("cuMemFree", s))?;
    closed.map_err(|message| Error::Plugin {
        what: WHAT.into(),
        message,
        source: None,
    })?;
    Ok(report)
}
