//! Registration: the registrar registers the pool with each selected device
//! (a thread per device) in regions split at its `max_mr_size` on block
//! boundaries, and rolls everything back when any region fails; the live
//! registration deregisters it all again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use pool_core::host::memlock::{self, MemlockPolicy};
use pool_core::plugin::PinContext;
use pool_core::plugin::{Registrar, Registration};
use pool_core::{Error, PageSize, Region, Result, TeardownIssue};
use pool_core::{format_bytes, mr_regions};
use rustix::process::Rlimit;
use serde_json::{Value, json};

use crate::NAME;
use crate::error::{device_error, layout_error, list_error, load_error, open_error, reg_error};
use crate::memlock::{memlock_check, raise_soft_limit, restore_soft_limit};
use crate::options::RdmaOptions;
use crate::probe::{probe, select};
use crate::sys::{self, CloseFailure, Device, Session, Verbs};

/// Access flags of every region: local write, remote write, remote read.
const ACCESS: std::ffi::c_int =
    sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;

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
    fn plan(&self, size: pool_core::MappedSize, ctx: &PinContext) -> serde_json::Value {
        let block = ctx.block(size.page());
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

    fn register(&self, region: Region<'_>, ctx: &PinContext) -> Result<Box<dyn Registration>> {
        let started = Instant::now();
        let len = region.mapped_len();
        let page = region.page();
        let policy = ctx.memlock_bound;
        let limits = memlock::state();
        let memlock_line = memlock_check(&limits, len, 1, region.is_hugetlb(), policy)?;
        let block = ctx.block(page);
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
        self.release()
    }
}

impl RdmaRegistration {
    /// Close every device (deregistering its regions last-first) and put
    /// the memlock soft limit back: what `deregister` and `Drop` both do.
    fn release(&mut self) -> Vec<TeardownIssue> {
        let issues = if self.devices.is_empty() {
            Vec::new()
        } else {
            close_all(
                std::mem::take(&mut self.devices)
                    .into_iter()
                    .map(|d| (d.name, d.session))
                    .collect(),
            )
        };
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
        drop(self.release());
    }
}
