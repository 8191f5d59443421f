//! `cuda`: pins a pool for GPU DMA with `cuMemHostRegister`, the driver
//! loaded at run time.
//!
//! ```toml
//! pin = { kind = "cuda", required = false }
//! block_size = "2MiB"      # chunk boundaries never split a block
//!
//! [cuda]
//! device = 0               # device index (default 0)
//! chunk_size = "64GiB"     # most bytes per cuMemHostRegister call (default 64 GiB)
//! flags = ["portable"]     # "portable", "devicemap" (default ["portable"])
//! ```
//!
//! What [`Pinner::pin`] does, in order:
//!
//! 1. Finds the driver library through cudarc (`is_culib_present`) and
//!    resolves every driver symbol this crate calls. No driver, or one that
//!    lacks a symbol, is [`Error::NotAvailable`]; nothing panics and no panic
//!    message is printed (cudarc's own wrappers panic on both, so they are
//!    not used: see the `sys` module).
//! 2. Checks the memlock bound ([`pool_core::host::memlock::check`]) before any
//!    driver call, so a pool the process may not pin is skipped (best
//!    effort) or refused (required) without touching the GPU (seed 004: a
//!    failed registration can leave the CUDA context broken).
//! 3. `cuInit`, the device by index, its primary context retained (for as
//!    long as the pin lives: registrations die with their context) and made
//!    current on the calling thread while registering; the thread's previous
//!    context is current again afterwards.
//! 4. `cuMemHostRegister_v2` over
//!    [`registration_chunks`]:
//!    chunks of at most `chunk_size` (NVIDIA drivers from R580 reject one
//!    call of 512 GiB or more), page-aligned and never splitting a block of
//!    `block_size` (default: the page size). All or nothing: when a chunk
//!    fails, the chunks before it are unregistered in reverse and the error
//!    names the chunk, its offset and size, and the driver's error name.
//!
//! The [`Pin`] reports the device, the flags, each chunk's offset, length
//! and seconds, the total and per-GiB seconds and the memlock verdict.
//! Unpinning unregisters in reverse, then releases the primary context; a
//! step that fails is a [`TeardownIssue`], never a panic.
//!
//! [`verify_copy`] copies a buffer host → device → host from the pinned pool
//! and checks it (`hostpool alloc --pin cuda --verify-copy`).
//!
//! The driver is the real `libcuda.so.1`, or in tests the `fake-cuda` test
//! double loaded in its place through `LD_LIBRARY_PATH`.

mod doctor;

use std::time::Instant;

use pool_core::host::memlock;
use pool_core::layout::{Extent, format_bytes, registration_chunks};
use pool_core::plugin::{PinCost, parse_table};
use pool_core::{
    ByteSize, Error, Pin, Pinner, PinnerPlugin, PoolConfig, Region, Result, TeardownIssue,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod sys;

use sys::{Api, Context, Load, Status};

/// The plugin name.
pub const NAME: &str = "cuda";

/// The default chunk size: 64 GiB, as vLLM registers.
pub const DEFAULT_CHUNK_SIZE: ByteSize = ByteSize::gib(64);

/// The smallest single registration NVIDIA drivers from R580 refuse
/// ("failed to allocate page table"); `chunk_size` must stay below it.
pub const DRIVER_CHUNK_LIMIT: u64 = 512 << 30;

/// Every driver symbol this crate resolves (all of them before the first
/// call), as the driver library exports them.
pub const DRIVER_SYMBOLS: &[&str] = sys::SYMBOLS;

/// A `cuMemHostRegister` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegisterFlag {
    /// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every CUDA context, not
    /// only the one that registered it.
    Portable,
    /// `CU_MEMHOSTREGISTER_DEVICEMAP`: also mapped into the device's address
    /// space (`cuMemHostGetDevicePointer`).
    Devicemap,
}

impl RegisterFlag {
    fn bits(self) -> u32 {
        match self {
            RegisterFlag::Portable => sys::REGISTER_PORTABLE,
            RegisterFlag::Devicemap => sys::REGISTER_DEVICEMAP,
        }
    }
}

fn default_chunk_size() -> ByteSize {
    DEFAULT_CHUNK_SIZE
}

fn default_flags() -> Vec<RegisterFlag> {
    vec![RegisterFlag::Portable]
}

/// The `[cuda]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaOptions {
    /// Device index (CUDA ordinal), default 0.
    #[serde(default)]
    pub device: u32,
    /// Most bytes per `cuMemHostRegister` call (bytes or an IEC size),
    /// default 64 GiB; below 512 GiB.
    #[serde(default = "default_chunk_size")]
    pub chunk_size: ByteSize,
    /// Registration flags, default `["portable"]`; `[]` registers for the
    /// primary context only.
    #[serde(default = "default_flags")]
    pub flags: Vec<RegisterFlag>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            chunk_size: DEFAULT_CHUNK_SIZE,
            flags: default_flags(),
        }
    }
}

impl CudaOptions {
    /// Parse and check a `[cuda]` table (`None`: the defaults).
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown key, a zero `chunk_size`, one of
    /// 512 GiB or more, or a device index beyond `i32`.
    pub fn from_table(table: Option<&Value>) -> Result<CudaOptions> {
        let o: CudaOptions = parse_table(NAME, table)?;
        if o.chunk_size.get() == 0 {
            return Err(Error::config(
                "in table [cuda]: chunk_size must be more than 0 bytes (default 64GiB)",
            ));
        }
        if o.chunk_size.get() >= DRIVER_CHUNK_LIMIT {
            return Err(Error::config(format!(
                "in table [cuda]: chunk_size {} is 512 GiB or more, which NVIDIA drivers from R580 \
                 reject in one cuMemHostRegister call; use 256GiB or less (default 64GiB)",
                format_bytes(o.chunk_size.get())
            )));
        }
        if i32::try_from(o.device).is_err() {
            return Err(Error::config(format!(
                "in table [cuda]: device {} is not a CUDA device index",
                o.device
            )));
        }
        Ok(o)
    }

    /// The flags as the driver takes them.
    pub fn flag_bits(&self) -> u32 {
        self.flags.iter().fold(0, |acc, f| acc | f.bits())
    }
}

/// The configured pinner.
#[derive(Debug, Clone)]
pub struct CudaPinner {
    options: CudaOptions,
}

impl CudaPinner {
    /// A pinner with these options.
    pub fn new(options: CudaOptions) -> CudaPinner {
        CudaPinner { options }
    }

    /// Its options.
    pub fn options(&self) -> &CudaOptions {
        &self.options
    }
}

fn build(table: Option<&Value>) -> Result<Box<dyn Pinner>> {
    Ok(Box::new(CudaPinner::new(CudaOptions::from_table(table)?)))
}

inventory::submit! {
    PinnerPlugin::new(
        NAME,
        "cuMemHostRegister of the pool in chunks (driver loaded at run time; [cuda] device, chunk_size, flags)",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_cost(PinCost {
        seconds_per_page: pool_core::plugin::REGISTER_SECONDS_PER_PAGE,
        free_on_huge_pages: false,
    })
    .with_doctor(doctor::findings)
}

/// The driver, or why it is not available.
fn driver(what: &str) -> Result<&'static Api> {
    sys::load().map_err(|e| Error::NotAvailable {
        what: what.to_string(),
        reason: match e {
            Load::NoLibrary => "no CUDA driver (libcuda.so.1) on this host; install the NVIDIA \
                driver, or put the directory that holds libcuda.so.1 on LD_LIBRARY_PATH (in a \
                container: the NVIDIA container toolkit and `--gpus`)"
                .to_string(),
            Load::MissingSymbols(missing) => format!(
                "the CUDA driver library lacks {}: it is older than the CUDA 12 driver API this \
                 build calls; update the NVIDIA driver",
                missing.join(", ")
            ),
            Load::Panicked(msg) => format!("opening the CUDA driver library failed: {msg}"),
        },
    })
}

/// Whether the CUDA driver library is on this host and exports every symbol
/// this crate calls. Opens the library (through cudarc) and looks symbols
/// up; calls none of them, so it needs no device. For `hostpool doctor`.
///
/// # Errors
/// [`Error::NotAvailable`] saying what is missing, as pinning would.
pub fn probe_driver() -> Result<()> {
    driver("cuda pinner").map(|_| ())
}

/// The CUDA driver and its devices, as [`probe_devices`] finds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 12080 for CUDA 12.8; `None` when the
    /// driver would not say.
    pub version: Option<i32>,
    /// The device names by ordinal (`cuDeviceGetName`); a device whose name
    /// cannot be read is listed as `device N`.
    pub devices: Vec<String>,
    /// Why there is no device, when `cuInit` said `CUDA_ERROR_NO_DEVICE`.
    pub no_device: Option<String>,
}

impl DriverInfo {
    /// The version as `major.minor`, e.g. `12.8`.
    pub fn version_text(&self) -> Option<String> {
        self.version
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
    }
}

/// The driver version and the devices with their names, without pinning:
/// `cuDriverGetVersion`, `cuInit`, `cuDeviceGetCount`, `cuDeviceGet` and
/// `cuDeviceGetName` only. No context is created and no memory is touched.
/// For `hostpool doctor`.
///
/// # Errors
/// [`Error::NotAvailable`] when there is no usable driver (as for
/// [`probe_driver`]) or `cuInit` fails other than with "no device";
/// [`Error::Plugin`] when `cuDeviceGetCount` fails. No device at all is
/// `Ok` with an empty list and [`DriverInfo::no_device`] set.
pub fn probe_devices() -> Result<DriverInfo> {
    const WHAT: &str = "CUDA driver";
    let api = driver(WHAT)?;
    sys::guarded(|| {
        let version = api.driver_version().ok();
        match api.init() {
            Ok(()) => {}
            Err(s) if s == sys::NO_DEVICE => {
                return Ok(DriverInfo {
                    version,
                    devices: Vec::new(),
                    no_device: Some(format!("cuInit returned {}", describe(api, s))),
                });
            }
            Err(s) => {
                return Err(Error::NotAvailable {
                    what: WHAT.into(),
                    reason: format!(
                        "the CUDA driver did not initialise: cuInit returned {}",
                        describe(api, s)
                    ),
                });
            }
        }
        let count = api.device_count().map_err(|s| Error::Plugin {
            what: WHAT.into(),
            message: format!("cuDeviceGetCount failed: {}", describe(api, s)),
            source: None,
        })?;
        let devices = (0..count.max(0))
            .map(|i| {
                api.device(i)
                    .and_then(|d| api.device_name(d))
                    .ok()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| format!("device {i}"))
            })
            .collect();
        Ok(DriverInfo {
            version,
            devices,
            no_device: None,
        })
    })
    .unwrap_or_else(|msg| Err(panicked(WHAT, &msg)))
}

/// `NAME (description)` of a driver status.
fn describe(api: &Api, status: Status) -> String {
    match api.error_string(status) {
        Some(s) => format!("{} ({s})", api.error_name(status)),
        None => api.error_name(status),
    }
}

fn panicked(what: &str, msg: &str) -> Error {
    Error::Plugin {
        what: what.to_string(),
        message: format!(
            "the CUDA driver binding panicked ({msg}); this is a bug in hostpool, please report it"
        ),
        source: None,
    }
}

/// A device with its primary context retained and current on this thread.
#[derive(Debug)]
struct Session {
    api: &'static Api,
    index: u32,
    device: i32,
    ctx: Context,
    /// The thread's context before `open`, put back by `restore` (`None`
    /// when the driver would not say).
    previous: Option<Context>,
    name: String,
    driver_version: i32,
}

impl Session {
    fn open(api: &'static Api, what: &str, index: u32) -> Result<Session> {
        let na = |reason: String| Error::NotAvailable {
            what: what.to_string(),
            reason,
        };
        let failed = |step: &str, s: Status| Error::Plugin {
            what: what.to_string(),
            message: format!("{step} failed: {}", describe(api, s)),
            source: None,
        };
        match api.init() {
            Ok(()) => {}
            Err(s) if s == sys::NO_DEVICE => {
                return Err(na(format!(
                    "no CUDA device: cuInit returned {}",
                    describe(api, s)
                )));
            }
            Err(s) => {
                return Err(na(format!(
                    "the CUDA driver did not initialise: cuInit returned {}",
                    describe(api, s)
                )));
            }
        }
        let count = api
            .device_count()
            .map_err(|s| failed("cuDeviceGetCount", s))?;
        let ordinal = i32::try_from(index).unwrap_or(i32::MAX);
        if ordinal >= count {
            return Err(na(format!(
                "CUDA device {index} does not exist: this host has {count} CUDA device{}{}; set \
                 [cuda] device",
                if count == 1 { "" } else { "s" },
                if count > 0 {
                    format!(" (0 to {})", count - 1)
                } else {
                    String::new()
                }
            )));
        }
        let device = api
            .device(ordinal)
            .map_err(|s| failed(&format!("cuDeviceGet({index})"), s))?;
        let name = api.device_name(device).unwrap_or_default();
        let driver_version = api.driver_version().unwrap_or(0);
        let ctx = api
            .retain_primary(device)
            .map_err(|s| failed(&format!("cuDevicePrimaryCtxRetain of device {index}"), s))?;
        let previous = api.current().ok();
        let session = Session {
            api,
            index,
            device,
            ctx,
            previous,
            name,
            driver_version,
        };
        if let Err(s) = api.set_current(ctx) {
            let e = failed(&format!("cuCtxSetCurrent of device {index}"), s);
            let _ = session.close();
            return Err(e);
        }
        Ok(session)
    }

    /// Make the thread's previous context current again (a warning when
    /// the driver refuses: the thread keeps ours, which stays valid).
    fn restore(&self) {
        if let Some(previous) = self.previous
            && let Err(s) = self.api.set_current(previous)
        {
            tracing::warn!(
                "cuda pinner could not restore the thread's CUDA context: {}",
                describe(self.api, s)
            );
        }
    }

    /// Release the primary context.
    fn close(&self) -> Result<(), String> {
        self.api.release_primary(self.device).map_err(|s| {
            format!(
                "cuDevicePrimaryCtxRelease of device {}: {}",
                self.index,
                describe(self.api, s)
            )
        })
    }
}

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
struct Chunk {
    index: usize,
    addr: usize,
    report: ChunkReport,
}

/// Registered chunks; unregisters them in reverse when dropped while armed
/// (an unwinding panic), so nothing stays pinned behind an error.
#[derive(Debug)]
struct Registered<'s> {
    session: &'s Session,
    chunks: Vec<Chunk>,
}

impl Registered<'_> {
    /// Unregister every chunk in reverse; the failures, in words.
    fn rollback(&mut self) -> Vec<String> {
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
fn register_hint(status: Status) -> &'static str {
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
    fn plan(&self, size: pool_core::MappedSize, config: &PoolConfig) -> serde_json::Value {
        let block = config.block_size.map_or(size.page().get(), ByteSize::get);
        match pool_core::layout::registration_chunks(
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

    fn pin(&self, region: Region<'_>, config: &PoolConfig) -> Result<Box<dyn Pin>> {
        sys::guarded(|| self.pin_inner(region, config))
            .unwrap_or_else(|msg| Err(panicked("cuda pinner", &msg)))
    }
}

impl CudaPinner {
    fn pin_inner(&self, region: Region<'_>, config: &PoolConfig) -> Result<Box<dyn Pin>> {
        const WHAT: &str = "cuda pinner";
        let api = driver(WHAT)?;
        let len = region.mapped_len();
        let memlock = memlock::check(len, NAME, region.is_hugetlb(), config.pin.memlock_bound)?;
        let block = config.block_size.map_or(region.page().get(), ByteSize::get);
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

struct RegisterFailure<'a> {
    api: &'a Api,
    session: &'a Session,
    index: usize,
    count: usize,
    extent: Extent,
    addr: usize,
    status: Status,
    rollback_failures: Vec<String>,
    close_failure: Option<String>,
}

fn register_error(f: RegisterFailure<'_>) -> Error {
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
struct LivePin {
    session: Session,
    chunks: Vec<Chunk>,
}

impl LivePin {
    /// Unregister in reverse (with the context current on this thread,
    /// which may not be the one that pinned, and the thread's own context
    /// put back afterwards), then release the context.
    fn release(self) -> Vec<TeardownIssue> {
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
    live: Option<LivePin>,
    details: Value,
}

impl CudaPin {
    fn release(&mut self) -> Vec<TeardownIssue> {
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
fn copy_round_trip(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_defaults_to_device_0_64_gib_chunks_portable() {
        let o = CudaOptions::from_table(None).unwrap();
        assert_eq!(o, CudaOptions::default());
        assert_eq!(o.chunk_size, ByteSize::gib(64));
        assert_eq!(o.flag_bits(), 1);
    }

    #[test]
    fn the_table_takes_iec_sizes_and_both_flags() {
        let o = CudaOptions::from_table(Some(&json!({
            "device": 3, "chunk_size": "256GiB", "flags": ["portable", "devicemap"]
        })))
        .unwrap();
        assert_eq!(o.device, 3);
        assert_eq!(o.chunk_size.get(), 256 << 30);
        assert_eq!(o.flag_bits(), 3);
        let o = CudaOptions::from_table(Some(&json!({"chunk_size": 4096, "flags": []}))).unwrap();
        assert_eq!((o.chunk_size.get(), o.flag_bits()), (4096, 0));
    }

    #[test]
    fn the_table_rejects_unknown_keys_flags_and_sizes_the_driver_refuses() {
        for (table, want) in [
            (json!({"chunksize": "1GiB"}), "chunksize"),
            (json!({"flags": ["iomemory"]}), "iomemory"),
            (json!({"chunk_size": "64G"}), "GiB"),
            (json!({"chunk_size": 0}), "more than 0"),
            (json!({"chunk_size": "512GiB"}), "R580"),
            (
                json!({"device": 4_000_000_000u64}),
                "not a CUDA device index",
            ),
        ] {
            let e = CudaOptions::from_table(Some(&table)).unwrap_err();
            let msg = e.to_string();
            assert!(e.is_usage(), "{e:?}");
            assert!(
                msg.contains(want) && msg.contains("[cuda]"),
                "{table}: missing {want:?} in {msg}"
            );
        }
        assert!(CudaOptions::from_table(Some(&json!({"chunk_size": "511GiB"}))).is_ok());
    }

    #[test]
    fn the_plugin_is_registered_under_its_name() {
        let p = pool_core::plugin::lookup::<PinnerPlugin>(NAME).unwrap();
        assert_eq!(p.origin, "pinner-cuda");
        let pinner = (p.build)(None).unwrap();
        assert_eq!(pinner.name(), NAME);
    }

    #[test]
    fn the_symbol_list_has_every_call_once() {
        let mut s = DRIVER_SYMBOLS.to_vec();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), DRIVER_SYMBOLS.len());
        for want in [
            "cuMemHostRegister_v2",
            "cuMemHostUnregister",
            "cuGetErrorName",
        ] {
            assert!(DRIVER_SYMBOLS.contains(&want));
        }
    }

    #[test]
    fn error_text_names_chunk_offset_size_and_driver_error() {
        let hint = register_hint(2);
        assert!(hint.contains("ulimit -l"));
        assert!(register_hint(1).contains("chunk_size"));
    }
}
