//! The `rdma` registrar: registers a pool with RDMA NICs through libibverbs,
//! so that NIXL, UCX or Mooncake can move KV-cache blocks to and from it.
//!
//! libibverbs is loaded at run time (`libloading`), so nothing RDMA is needed
//! to build, and a host without it gets a clear "not available" error rather
//! than a missing-library failure at start-up.
//!
//! ```toml
//! register = ["rdma"]
//! block_size = "2MiB"          # regions never split a block
//!
//! [rdma]
//! devices = ["mlx5_0", "mlx5_1"]   # default: every device present
//! library = "libibverbs.so.1"      # default; a path with a `/` names a file
//! ```
//!
//! For each selected device, in parallel (a thread per device): open it,
//! allocate a protection domain, query `max_mr_size`, and register the whole
//! aligned mapping in regions of at most `max_mr_size` bytes whose boundaries
//! fall on `lcm(page, block)` ([`pool_core::mr_regions`]), with local
//! write, remote write and remote read access. All or nothing: when any
//! region on any device fails, every device stops and every region
//! registered so far is deregistered, last-first on each device, before the
//! error is returned.
//!
//! Before anything is loaded, the pool is checked against the memlock bound
//! ([`pool_core::host::memlock::check`]): `ibv_reg_mr` counts the pages it pins
//! against `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`, once per
//! registration, so a pool registered on N devices counts N times. The
//! kernel (`ib_umem_get`) compares the pinned total with the *soft* limit,
//! while the bound is the hard one; so when the soft limit is too low and the
//! hard one allows more, the soft limit is raised to the hard one for as long
//! as the pool is registered, and restored on deregistration (the report says
//! so under `memlock_soft_limit`).
//!
//! The report (`details`) lists, per device, its name, `max_mr_size`, the time
//! taken and the regions as `{offset, addr, addr_u64, len, lkey, rkey}` (the
//! address as a hex string and as an integer).

mod doctor;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use pool_core::host::memlock::{self, MemlockPolicy};
use pool_core::host::process;
use pool_core::plugin::PinCost;
use pool_core::plugin::{Registrar, RegistrarPlugin, Registration};
use pool_core::{Context, Error, Extent, PageSize, PoolConfig, Region, Result, TeardownIssue};
use pool_core::{LayoutError, format_bytes, mr_regions};
use rustix::process::Rlimit;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod sys;

use sys::{CloseFailure, Device, LoadError, OpenFailure, Session, Verbs};

/// The plugin name, and the name of its config table.
pub const NAME: &str = "rdma";

/// The library loaded when `[rdma] library` is not set.
pub const DEFAULT_LIBRARY: &str = "libibverbs.so.1";

/// How to install libibverbs, for error messages.
const INSTALL: &str = "install the RDMA user-space library from rdma-core (Debian/Ubuntu: \
    `apt-get install libibverbs1 ibverbs-providers`; RHEL/Fedora: `dnf install libibverbs`), \
    or point `[rdma] library` at it";

/// Access flags of every region: local write, remote write, remote read.
const ACCESS: std::ffi::c_int =
    sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;

/// The `[rdma]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaOptions {
    /// Device names (`ibv_devices`), e.g. `mlx5_0`; every device when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    /// The library to load instead of `libibverbs.so.1`: a bare name goes
    /// through the dynamic loader's search path, a name with a `/` is a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
}

impl RdmaOptions {
    fn validate(&self) -> Result<()> {
        if let Some(devices) = &self.devices {
            if devices.is_empty() {
                return Err(Error::config(
                    "[rdma] devices is empty; name at least one device (see `ibv_devices`), or leave \
                     the key out to register with every device",
                ));
            }
            for (i, d) in devices.iter().enumerate() {
                if d.is_empty() {
                    return Err(Error::config("[rdma] devices holds an empty name"));
                }
                if devices[..i].contains(d) {
                    return Err(Error::config(format!(
                        "[rdma] devices names `{d}` twice; name each device once"
                    )));
                }
            }
        }
        if self.library.as_deref() == Some("") {
            return Err(Error::config(
                "[rdma] library is empty; give a path or leave the key out for libibverbs.so.1",
            ));
        }
        Ok(())
    }

    /// The library to load.
    pub fn library(&self) -> &str {
        self.library.as_deref().unwrap_or(DEFAULT_LIBRARY)
    }
}

/// The `rdma` registrar, configured.
#[derive(Debug, Clone)]
pub struct RdmaRegistrar {
    options: RdmaOptions,
}

impl RdmaRegistrar {
    /// A registrar with these options.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or repeated device name or an empty
    /// library path.
    pub fn new(options: RdmaOptions) -> Result<RdmaRegistrar> {
        options.validate()?;
        Ok(RdmaRegistrar { options })
    }

    /// The options.
    pub fn options(&self) -> &RdmaOptions {
        &self.options
    }
}

fn build(table: Option<&Value>) -> Result<Box<dyn Registrar>> {
    Ok(Box::new(RdmaRegistrar::new(
        pool_core::plugin::parse_table(NAME, table)?,
    )?))
}

inventory::submit! {
    RegistrarPlugin::new(
        NAME,
        "RDMA NICs through libibverbs (loaded at run time): ibv_reg_mr on every device in \
         parallel, regions split at max_mr_size on block boundaries; [rdma] devices, library",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_cost(PinCost::new(pool_core::plugin::REGISTER_SECONDS_PER_PAGE, false))
    .with_doctor(doctor::findings)
}

/// One RDMA device as [`probe`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceProbe {
    /// The kernel device name (`ibv_get_device_name`), e.g. `mlx5_0`.
    pub name: String,
    /// `ibv_query_device(...).max_mr_size`, when the device could be opened
    /// and queried.
    pub max_mr_size: Option<u64>,
    /// What failed, when something did (open, protection domain, query or
    /// close), with the errno.
    pub error: Option<String>,
}

/// The RDMA devices the registrar would use, without registering anything:
/// loads the library of `options`, lists the devices (all of them, not only
/// `[rdma] devices`), and opens each one to read its `max_mr_size`, then
/// closes it again. For `hostpool doctor`.
///
/// # Errors
/// [`Error::NotAvailable`] when the library cannot be loaded (naming it and
/// the package to install) or the kernel has no RDMA (`ENOSYS` from
/// `ibv_get_device_list`), as registration would say; [`Error::Plugin`] for
/// another failure to list the devices. No device is `Ok` with an empty list.
pub fn probe(options: &RdmaOptions) -> Result<Vec<DeviceProbe>> {
    options.validate()?;
    let library = options.library();
    let verbs = Arc::new(Verbs::load(library).map_err(|e| load_error(library, e))?);
    let list = verbs.device_list().map_err(list_error)?;
    Ok(list
        .devices()
        .iter()
        .map(|device| {
            let name = device.name().to_string();
            let session = match Session::open(&verbs, device) {
                Ok(s) => s,
                Err(f) => {
                    return DeviceProbe {
                        name,
                        max_mr_size: None,
                        error: Some(format!("{}: {}", f.step, f.error)),
                    };
                }
            };
            let queried = session.max_mr_size();
            let closed = session.close();
            let mut errors: Vec<String> = closed
                .iter()
                .map(|c| format!("{}: {}", c.step, c.error))
                .collect();
            if let Err(e) = &queried {
                errors.insert(0, format!("ibv_query_device: {e}"));
            }
            DeviceProbe {
                name,
                max_mr_size: queried.ok(),
                error: (!errors.is_empty()).then(|| errors.join("; ")),
            }
        })
        .collect())
}

/// What was asked of each device thread.
struct Job<'a> {
    verbs: &'a Arc<Verbs>,
    region: Region<'a>,
    page: PageSize,
    block: u64,
    abort: &'a AtomicBool,
}

/// What one device thread did.
struct DeviceResult {
    name: String,
    max_mr_size: Option<u64>,
    seconds: f64,
    session: Option<Session>,
    error: Option<Error>,
}

impl Registrar for RdmaRegistrar {
    fn name(&self) -> &'static str {
        NAME
    }

    /// The memory regions each selected device would get: the pool split at
    /// the device's `max_mr_size` on block boundaries. Opens each device to
    /// read `max_mr_size` and closes it again; registers nothing.
    fn plan(&self, size: pool_core::MappedSize, config: &PoolConfig) -> serde_json::Value {
        let block = config
            .block_size
            .map_or(size.page().get(), pool_core::ByteSize::get);
        let devices = match probe(&self.options) {
            Ok(d) => d,
            Err(e) => return serde_json::json!({ "error": e.to_string() }),
        };
        let wanted = |name: &str| {
            self.options
                .devices
                .as_ref()
                .is_none_or(|w| w.iter().any(|d| d == name))
        };
        let per_device: Vec<serde_json::Value> = devices
            .iter()
            .filter(|d| wanted(&d.name))
            .map(|d| match d.max_mr_size {
                Some(max) => match pool_core::mr_regions(size.mapped(), size.page(), block, max) {
                    Ok(regions) => serde_json::json!({
                        "name": d.name,
                        "max_mr_size": max,
                        "regions": regions.iter().map(|r| serde_json::json!({"offset": r.offset, "len": r.len})).collect::<Vec<_>>(),
                    }),
                    Err(e) => serde_json::json!({ "name": d.name, "max_mr_size": max, "error": e.to_string() }),
                },
                None => serde_json::json!({ "name": d.name, "error": d.error.clone().unwrap_or_default() }),
            })
            .collect();
        serde_json::json!({ "block": block, "devices": per_device })
    }

    fn register(&self, region: Region<'_>, config: &PoolConfig) -> Result<Box<dyn Registration>> {
        let started = Instant::now();
        let len = region.mapped_len();
        let page = region.page();
        let policy = config.pin.memlock_bound;
        let limits = memlock::state();
        let memlock_line = memlock_check(&limits, len, 1, region.is_hugetlb(), policy)?;
        let block = config.block_size.map_or(page.get(), |b| b.0);
        // Refuse a block the layout cannot honour before touching any device.
        mr_regions(len, page, block, u64::MAX)?;

        let library = self.options.library();
        let verbs = Arc::new(Verbs::load(library).map_err(|e| load_error(library, e))?);
        let list = verbs.device_list().map_err(list_error)?;
        let selected = select(list.devices(), self.options.devices.as_deref())?;
        let memlock_line = if selected.len() > 1 {
            memlock_check(&limits, len, selected.len(), region.is_hugetlb(), policy)?
        } else {
            memlock_line
        };

        let need = len.saturating_mul(u64::try_from(selected.len()).unwrap_or(u64::MAX));
        let raised = if policy == MemlockPolicy::Check {
            raise_soft_limit(&limits, need)
        } else {
            None
        };

        let abort = AtomicBool::new(false);
        let job = Job {
            verbs: &verbs,
            region,
            page,
            block,
            abort: &abort,
        };
        let results = parallel(
            &selected,
            |d| format!("rdma-{}", d.name()),
            |d| register_device(&job, d),
            |d| DeviceResult {
                name: d.name().to_string(),
                max_mr_size: None,
                seconds: 0.0,
                session: None,
                error: Some(Error::Plugin {
                    what: format!("rdma registrar on {}", d.name()),
                    message: "the registration thread panicked".into(),
                    source: None,
                }),
            },
        );
        drop(list);

        if results.iter().any(|r| r.error.is_some()) {
            let error = roll_back(results);
            if let Some(old) = raised {
                restore_soft_limit(old);
            }
            return Err(error);
        }
        let devices: Vec<DeviceReg> = results
            .into_iter()
            .filter_map(|r| {
                Some(DeviceReg {
                    name: r.name,
                    max_mr_size: r.max_mr_size.unwrap_or(0),
                    seconds: r.seconds,
                    session: r.session?,
                })
            })
            .collect();
        let details = json!({
            "library": library,
            "access": ["local-write", "remote-write", "remote-read"],
            "block_size": block,
            "memlock": memlock_line,
            "memlock_soft_limit": raised.map(|old| json!({
                "raised_from": old.current,
                "to": old.maximum,
                "restored_on_deregister": true,
            })),
            "seconds": started.elapsed().as_secs_f64(),
            "devices": devices.iter().map(DeviceReg::details).collect::<Vec<_>>(),
        });
        Ok(Box::new(RdmaRegistration {
            devices,
            details,
            restore: raised,
        }))
    }
}

/// Open one device, query it, register every region; stop early when
/// another device failed.
fn register_device(job: &Job<'_>, device: &Device) -> DeviceResult {
    let started = Instant::now();
    let name = device.name().to_string();
    let mut out = DeviceResult {
        name: name.clone(),
        max_mr_size: None,
        seconds: 0.0,
        session: None,
        error: None,
    };
    let fail = |out: &mut DeviceResult, e: Error| {
        job.abort.store(true, Ordering::SeqCst);
        out.error = Some(e);
    };
    let mut session = match Session::open(job.verbs, device) {
        Ok(s) => s,
        Err(f) => {
            fail(&mut out, open_error(&name, f));
            return out;
        }
    };
    let max = match session.max_mr_size() {
        Ok(max) => max,
        Err(e) => {
            out.session = Some(session);
            fail(&mut out, device_error(&name, "ibv_query_device", e));
            return out;
        }
    };
    out.max_mr_size = Some(max);
    let mapped = job.region.mapped_len();
    match mr_regions(mapped, job.page, job.block, max) {
        Ok(extents) => {
            let n = extents.len();
            for (i, extent) in extents.into_iter().enumerate() {
                if job.abort.load(Ordering::SeqCst) {
                    break;
                }
                if let Err(e) = session.register(&job.region, extent, ACCESS) {
                    let e = reg_error(&name, &job.region, (i, n), extent, max, e);
                    fail(&mut out, e);
                    break;
                }
            }
        }
        Err(e) => fail(&mut out, layout_error(&name, max, job.page, job.block, e)),
    }
    out.session = Some(session);
    out.seconds = started.elapsed().as_secs_f64();
    out
}

/// Run `f` on every item, a thread each (inline for one item, or when a
/// thread cannot be started), and return the results in item order.
fn parallel<T: Sync, R: Send>(
    items: &[T],
    thread_name: impl Fn(&T) -> String,
    f: impl Fn(&T) -> R + Sync,
    on_panic: impl Fn(&T) -> R,
) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| {
                std::thread::Builder::new()
                    .name(thread_name(item))
                    .spawn_scoped(s, move || f(item))
                    .map_err(|e| {
                        tracing::warn!("cannot start a thread, working inline instead: {e}");
                    })
            })
            .collect();
        handles
            .into_iter()
            .zip(items)
            .map(|(h, item)| match h {
                Ok(h) => h.join().unwrap_or_else(|_| on_panic(item)),
                Err(()) => f(item),
            })
            .collect()
    })
}

/// Deregister everything the device threads registered (each device
/// last-first, devices in parallel) and return the first device's error,
/// saying what was undone and what could not be.
fn roll_back(results: Vec<DeviceResult>) -> Error {
    let mut error = None;
    let mut sessions = Vec::new();
    for r in results {
        if let (None, Some(e)) = (&error, r.error) {
            error = Some(e);
        }
        if let Some(s) = r.session {
            sessions.push((r.name, s));
        }
    }
    let undone: Vec<String> = sessions
        .iter()
        .filter(|(_, s)| !s.regions().is_empty())
        .map(|(name, s)| format!("{} on {name}", s.regions().len()))
        .collect();
    let issues = close_all(sessions);
    let note = if !issues.is_empty() {
        let list: Vec<String> = issues
            .iter()
            .map(|i| format!("{}: {}", i.step, i.detail))
            .collect();
        format!(
            "the rollback could not undo everything: {}",
            list.join("; ")
        )
    } else if undone.is_empty() {
        "nothing was registered".to_string()
    } else {
        format!(
            "nothing is left registered: the regions registered before the failure were \
             deregistered last-first ({})",
            undone.join(", ")
        )
    };
    let mut error = error.unwrap_or_else(|| Error::Plugin {
        what: "rdma registrar".into(),
        message: "registration failed".into(),
        source: None,
    });
    match &mut error {
        Error::Os { remedy, .. } => *remedy = format!("{remedy}; {note}"),
        Error::Plugin { message, .. } => *message = format!("{message}; {note}"),
        Error::NotAvailable { reason, .. } => *reason = format!("{reason}; {note}"),
        _ => tracing::warn!("rdma registration rolled back: {note}"),
    }
    error
}

/// Close every session (a thread per device) and turn failures into
/// teardown issues.
fn close_all(sessions: Vec<(String, Session)>) -> Vec<TeardownIssue> {
    let slots: Vec<std::sync::Mutex<Option<(String, Session)>>> = sessions
        .into_iter()
        .map(|s| std::sync::Mutex::new(Some(s)))
        .collect();
    let take = |slot: &std::sync::Mutex<Option<(String, Session)>>| {
        slot.lock().ok().and_then(|mut g| g.take())
    };
    parallel(
        &slots,
        |_| "rdma-dereg".to_string(),
        |slot| match take(slot) {
            Some((name, session)) => session
                .close()
                .into_iter()
                .map(|f| close_issue(&name, &f))
                .collect(),
            None => Vec::new(),
        },
        |_| {
            vec![TeardownIssue::log(
                "ibv_dereg_mr",
                "an RDMA deregistration thread panicked; its device may keep regions registered \
                 until the process exits",
            )]
        },
    )
    .into_iter()
    .flatten()
    .collect()
}

fn close_issue(device: &str, f: &CloseFailure) -> TeardownIssue {
    let what = match f.region {
        Some((index, extent, addr)) => format!(
            "region {} at {addr:#x} (offset {:#x}, {})",
            index + 1,
            extent.offset,
            format_bytes(extent.len)
        ),
        None if f.step == "ibv_dealloc_pd" => "the protection domain".to_string(),
        None => "the device context".to_string(),
    };
    TeardownIssue::log(
        f.step,
        format!(
            "RDMA device {device}: {what} could not be released: {}",
            f.error
        ),
    )
}

/// One device's live registration.
#[derive(Debug)]
struct DeviceReg {
    name: String,
    max_mr_size: u64,
    seconds: f64,
    session: Session,
}

impl DeviceReg {
    fn details(&self) -> Value {
        json!({
            "name": self.name,
            "max_mr_size": self.max_mr_size,
            "seconds": self.seconds,
            "regions": self.session.regions().iter().map(|mr| json!({
                "offset": mr.extent.offset,
                "addr": format!("{:#x}", mr.addr),
                "addr_u64": mr.addr,
                "len": mr.len,
                "lkey": mr.lkey,
                "rkey": mr.rkey,
            })).collect::<Vec<_>>(),
        })
    }
}

/// A pool registered with one or more RDMA devices.
#[derive(Debug)]
pub struct RdmaRegistration {
    devices: Vec<DeviceReg>,
    details: Value,
    /// The memlock limits before the soft limit was raised, if it was.
    restore: Option<Rlimit>,
}

impl Registration for RdmaRegistration {
    fn details(&self) -> Value {
        self.details.clone()
    }

    /// Deregister every region last-first on each device (devices in
    /// parallel), free the protection domains, close the devices.
    fn deregister(mut self: Box<Self>) -> Vec<TeardownIssue> {
        let issues = close_all(
            std::mem::take(&mut self.devices)
                .into_iter()
                .map(|d| (d.name, d.session))
                .collect(),
        );
        if let Some(old) = self.restore.take() {
            restore_soft_limit(old);
        }
        issues
    }
}

impl Drop for RdmaRegistration {
    /// Dropped without [`Registration::deregister`]: release all the same
    /// (failures are logged).
    fn drop(&mut self) {
        if !self.devices.is_empty() {
            drop(close_all(
                std::mem::take(&mut self.devices)
                    .into_iter()
                    .map(|d| (d.name, d.session))
                    .collect(),
            ));
        }
        if let Some(old) = self.restore.take() {
            restore_soft_limit(old);
        }
    }
}

/// Bytes this process has pinned (`VmPin`): what `ib_umem_get` has counted.
fn pinned_bytes() -> Option<u64> {
    process::status_field("VmPin")
}

/// Raise the soft `RLIMIT_MEMLOCK` to the hard one when pinning `need` more
/// bytes would pass the soft one (the limit `ib_umem_get` checks) and the hard
/// one is higher. Returns the limits to restore.
fn raise_soft_limit(limits: &memlock::MemlockState, need: u64) -> Option<Rlimit> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    if limits.cap_ipc_lock {
        return None;
    }
    let old = getrlimit(Resource::Memlock);
    let soft = old.current?;
    let wanted = pinned_bytes().unwrap_or(0).saturating_add(need);
    if soft >= wanted || old.maximum.is_some_and(|hard| hard <= soft) {
        return None;
    }
    let new = Rlimit {
        current: old.maximum,
        maximum: old.maximum,
    };
    match setrlimit(Resource::Memlock, new) {
        Ok(()) => Some(old),
        Err(e) => {
            tracing::warn!("cannot raise the soft RLIMIT_MEMLOCK to the hard one: {e}");
            None
        }
    }
}

/// Put the soft limit back, unless someone changed it since.
fn restore_soft_limit(old: Rlimit) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let now = getrlimit(Resource::Memlock);
    if now.current == old.maximum
        && now.maximum == old.maximum
        && let Err(e) = setrlimit(Resource::Memlock, old)
    {
        tracing::warn!("cannot restore the soft RLIMIT_MEMLOCK: {e}");
    }
}

/// The memlock bound for `copies` registrations of `len` bytes.
fn memlock_check(
    state: &memlock::MemlockState,
    len: u64,
    copies: usize,
    hugetlb: bool,
    policy: MemlockPolicy,
) -> Result<String> {
    let copies_u64 = u64::try_from(copies).unwrap_or(u64::MAX);
    let who = if copies > 1 {
        format!("rdma on {copies} devices (each registration counts the pool again)")
    } else {
        NAME.to_string()
    };
    memlock::check_with(state, len.saturating_mul(copies_u64), &who, hugetlb, policy).map_err(|e| {
        match e {
            Error::NotAvailable { what, reason } => Error::NotAvailable {
                what,
                reason: format!(
                    "ibv_reg_mr counts the pages it registers against RLIMIT_MEMLOCK unless the \
                 process has CAP_IPC_LOCK, and {reason}"
                ),
            },
            other => other,
        }
    })
}

fn load_error(library: &str, e: LoadError) -> Error {
    match e {
        LoadError::Open(e) => Error::NotAvailable {
            what: "RDMA registration".into(),
            reason: format!("cannot load {library} ({}); {INSTALL}", chain(&e)),
        },
        LoadError::Symbol(symbol, e) => Error::NotAvailable {
            what: "RDMA registration".into(),
            reason: format!(
                "{library} has no `{symbol}` ({}): it is not libibverbs, or far too old; {INSTALL}",
                chain(&e)
            ),
        },
    }
}

/// An error and all its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

fn list_error(e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ENOSYS) {
        Error::NotAvailable {
            what: "RDMA registration".into(),
            reason: "kernel without RDMA: ibv_get_device_list failed with ENOSYS (there is no \
                     /sys/class/infiniband_verbs); load the RDMA modules (`modprobe ib_uverbs` and \
                     the NIC's RDMA driver, e.g. `mlx5_ib`), or in a container pass /dev/infiniband \
                     and /sys/class/infiniband_verbs through"
                .into(),
        }
    } else {
        Error::Plugin {
            what: "rdma registrar: ibv_get_device_list".into(),
            message: "cannot list the RDMA devices".into(),
            source: Some(Box::new(e)),
        }
    }
}

/// The devices the options select, in the order asked for (or the library's).
fn select<'a>(present: &'a [Device], wanted: Option<&[String]>) -> Result<Vec<&'a Device>> {
    if present.is_empty() {
        return Err(Error::NotAvailable {
            what: "RDMA registration".into(),
            reason:
                "no RDMA devices found (ibv_get_device_list returned none): check `ibv_devices` \
                     or `rdma link`, that the NIC's RDMA driver (e.g. mlx5_ib) and the user-space \
                     providers (ibverbs-providers) are installed, and in a container that \
                     /dev/infiniband is passed through"
                    .into(),
        });
    }
    let Some(wanted) = wanted else {
        return Ok(present.iter().collect());
    };
    wanted
        .iter()
        .map(|w| {
            present
                .iter()
                .find(|d| d.name() == w)
                .ok_or_else(|| Error::NotAvailable {
                    what: format!("RDMA device `{w}`"),
                    reason: format!(
                        "no such device; devices present: {}. Set [rdma] devices to some of them, \
                         or leave the key out to register with all",
                        present
                            .iter()
                            .map(Device::name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
        })
        .collect()
}

fn open_error(device: &str, f: OpenFailure) -> Error {
    let message = match f.step {
        "ibv_open_device" => {
            "cannot open the device; check access to /dev/infiniband/uverbs* and that the NIC's \
             RDMA driver is loaded"
        }
        _ => "cannot allocate a protection domain on the device",
    };
    device_error_with(device, f.step, message, f.error)
}

fn device_error(device: &str, step: &str, e: std::io::Error) -> Error {
    device_error_with(device, step, "the device refused the call", e)
}

fn device_error_with(device: &str, step: &str, message: &str, e: std::io::Error) -> Error {
    Error::Plugin {
        what: format!("rdma registrar: {step} on RDMA device {device}"),
        message: message.to_string(),
        source: Some(Box::new(e)),
    }
}

fn layout_error(device: &str, max: u64, page: PageSize, block: u64, e: LayoutError) -> Error {
    let message = match &e {
        LayoutError::UnitExceedsLimit { unit, .. } => format!(
            "its max_mr_size of {} is smaller than one registration unit of {} (the least common \
             multiple of the {page} page and the {} block), so no region could hold a whole \
             block; use a smaller block_size",
            format_bytes(max),
            format_bytes(*unit),
            format_bytes(block)
        ),
        _ => format!(
            "cannot split the pool at its max_mr_size of {}",
            format_bytes(max)
        ),
    };
    Error::Plugin {
        what: format!("rdma registrar on RDMA device {device}"),
        message,
        source: Some(Box::new(e)),
    }
}

fn reg_error(
    device: &str,
    region: &Region<'_>,
    (index, count): (usize, usize),
    extent: Extent,
    max: u64,
    e: std::io::Error,
) -> Error {
    let advice = match e.raw_os_error() {
        Some(libc::ENOMEM) => {
            let st = memlock::state();
            let limit = |l: Option<u64>| l.map_or("unlimited".to_string(), format_bytes);
            let why = if st.cap_ipc_lock {
                "this process has CAP_IPC_LOCK, so the limit is not the cause here: the NIC or the \
                 kernel ran out of memory for the translation tables (see the kernel log, dmesg)"
                    .to_string()
            } else {
                format!(
                    "this process has no CAP_IPC_LOCK, a soft limit of {}, a hard limit of {}, \
                     and {} already pinned (VmPin); raise the limit (`ulimit -l unlimited`, \
                     Docker `--ulimit memlock=-1`, systemd or containerd \
                     `LimitMEMLOCK=infinity`) or grant CAP_IPC_LOCK. ENOMEM can also mean the \
                     NIC ran out of translation resources: see the kernel log (dmesg)",
                    limit(st.soft),
                    limit(st.hard),
                    pinned_bytes().map_or("an unknown amount".to_string(), format_bytes)
                )
            };
            format!(
                "ibv_reg_mr pins the pages and counts them against RLIMIT_MEMLOCK unless the \
                 process has CAP_IPC_LOCK; {why}"
            )
        }
        Some(libc::EINVAL) => format!(
            "the device refused the range or the access flags (local write, remote write, remote \
             read): a region must not exceed its max_mr_size of {} and must cover whole pages",
            format_bytes(max)
        ),
        Some(libc::EFAULT) => {
            "the range is not mapped or not accessible; the pool must stay mapped while it is \
             registered"
                .to_string()
        }
        Some(libc::EPERM | libc::EACCES) => {
            "permission denied: check access to /dev/infiniband/uverbs* (and CAP_IPC_LOCK)"
                .to_string()
        }
        _ => "see the kernel log (dmesg) for the driver's reason".to_string(),
    };
    let mut context = Context::new(extent.len, region.page()).remedy(format!(
        "region {} of {count} at offset {:#x} ({}) of the pool, on RDMA device {device}; {advice}",
        index + 1,
        extent.offset,
        format_bytes(extent.offset)
    ));
    if let Some(p) = region.at(extent.offset) {
        context = context.addr(p as usize);
    }
    Error::os("ibv_reg_mr", e, context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_rejects_unknown_keys_and_bad_values() {
        let e = build(Some(&json!({"device": ["mlx5_0"]}))).unwrap_err();
        assert!(
            e.to_string().contains("[rdma]") && e.to_string().contains("device"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
        for (table, want) in [
            (json!({"devices": []}), "devices is empty"),
            (json!({"devices": ["a", "b", "a"]}), "names `a` twice"),
            (json!({"devices": [""]}), "empty name"),
            (json!({"library": ""}), "library is empty"),
        ] {
            let e = build(Some(&table)).unwrap_err();
            assert!(e.to_string().contains(want), "{table}: {e}");
            assert_eq!(e.exit_code(), 2);
        }
        let ok = build(Some(
            &json!({"devices": ["mlx5_0", "mlx5_1"], "library": "/x/libibverbs.so.1"}),
        ))
        .unwrap();
        assert_eq!(ok.name(), "rdma");
        assert_eq!(
            RdmaRegistrar::new(RdmaOptions::default())
                .unwrap()
                .options()
                .library(),
            "libibverbs.so.1"
        );
    }

    #[test]
    fn enosys_is_not_available_kernel_without_rdma_and_other_errnos_are_failures() {
        let e = list_error(std::io::Error::from_raw_os_error(libc::ENOSYS));
        assert!(e.is_not_available());
        assert!(e.to_string().contains("kernel without RDMA"), "{e}");
        let e = list_error(std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(!e.is_not_available());
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn the_memlock_error_says_ibv_reg_mr_counts_against_rlimit_memlock() {
        let st = memlock::MemlockState {
            soft: Some(8 << 20),
            hard: Some(8 << 20),
            cap_ipc_lock: false,
            ram: 64 << 30,
        };
        assert!(memlock_check(&st, 4 << 20, 2, false, MemlockPolicy::Check).is_ok());
        let e = memlock_check(&st, 4 << 20, 3, false, MemlockPolicy::Check).unwrap_err();
        let msg = e.to_string();
        assert!(e.is_not_available(), "{e:?}");
        for want in ["RLIMIT_MEMLOCK", "CAP_IPC_LOCK", "3 devices", "ulimit -l"] {
            assert!(msg.contains(want), "missing {want:?}: {msg}");
        }
        assert!(memlock_check(&st, u64::MAX, 2, false, MemlockPolicy::Ignore).is_ok());
    }
}
