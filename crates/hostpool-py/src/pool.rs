//! `hostpool.Pool` (`hostpool.Shared` is in `shared.rs`; the conversions
//! to Python in `convert.rs`).
//!
//! A `Pool` owns a built [`pool_core::Pool`] until `close()`. Everything
//! exported from it (buffers: `memoryview`, `numpy.frombuffer`,
//! `torch.frombuffer`; DLPack capsules: `numpy.from_dlpack`,
//! `torch.from_dlpack`) is counted under the same lock that `close()` takes,
//! and `close()` refuses while the count is not zero, so no path from Python
//! reaches unmapped memory. Every export also holds a reference to the
//! `Pool` object, so it cannot be collected (and torn down) under one.

use std::sync::Mutex;

use pool_core::host::memlock::MemlockPolicy;
use pool_core::{Error, PinScope, PinStatus, Pool, PoolPlan, PoolReport, PrefaultChoice};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::config::{self, Args, Parsed};
use crate::convert::{json_dict, opt_size};
use crate::shared::PyShared;
use crate::sys::Exports;
use crate::{build, errors, logs};
use hostpool::hostpool_handoff::lease::{LinkState, TierLink, Unanswered};
use hostpool::hostpool_handoff::{TierOp, TierPut, TierReply};

/// `Pool.files()`'s row: `(fd, offset, nbytes, path)`.
type PoolFileRow = (i32, u64, u64, Option<String>);

/// What is fixed once the pool is built.
#[derive(Debug)]
struct Info {
    addr: usize,
    nbytes: u64,
    mapped: u64,
    page: u64,
    backing: String,
    pinned: bool,
    pin_reason: Option<String>,
    shard: (u64, u64),
    block_size: Option<u64>,
    /// The config's plugin tables, as given (`Pool.plugin_table`).
    tables: std::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Debug)]
struct State {
    /// `None` once closed.
    pool: Option<Pool>,
    /// The final report, once closed.
    closed: Option<PoolReport>,
    /// The pool's address range after `close()`, kept until this object is
    /// collected: `torch.frombuffer` keeps the pool object and its pointer
    /// but releases the buffer export at once, so a tensor it made can
    /// outlive `close()`; its pointer then reaches zero pages of ours, never
    /// memory mapped there later.
    placeholder: Option<pool_core::Placeholder>,
    /// What must run before the pool goes (`Pool._before_close`): a
    /// registration of its memory elsewhere (Mooncake), undone first.
    before_close: Vec<Py<PyAny>>,
}

/// A host-memory pool: built, prefaulted, pinned and registered as asked.
///
/// Its base class, `sys::Exports`, holds the buffer protocol and DLPack and
/// counts what is exported.
#[pyclass(module = "hostpool._hostpool", name = "Pool", extends = Exports, frozen, weakref)]
#[derive(Debug)]
pub struct PyPool {
    state: Mutex<State>,
    info: Info,
    /// The link to the keeper's CPU tier (a leased pool's), made on first
    /// use. Locked only with the GIL released, so an ask that waits never
    /// holds the GIL or the pool's lock; dropped by `close()`.
    tier: Mutex<Option<TierLink>>,
}

impl PyPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An index's way to this pool's memory ([`crate::index::Reach`]).
    fn reach(
        pool: &Bound<'_, PyAny>,
        f: &mut dyn FnMut(pool_core::Region<'_>) -> PyResult<()>,
    ) -> PyResult<()> {
        let pool = pool.cast::<PyPool>()?;
        pool.get().with_region(pool.py(), f)
    }

    /// Run `f` on the pool's memory under its lock (a `close()` waits for
    /// it); an error when the pool is closed.
    fn with_region<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(pool_core::Region<'_>) -> PyResult<T>,
    ) -> PyResult<T> {
        let state = self.lock();
        let region = state.pool.as_ref().and_then(Pool::region).ok_or_else(|| {
            errors::raise(
                py,
                errors::Kind::Error,
                "the pool is closed: its memory is gone".into(),
            )
        })?;
        f(region)
    }

    fn from_plan(
        py: Python<'_>,
        plan: PoolPlan,
        progress: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<PyPool>> {
        let block_size = plan.config().block_size.map(pool_core::ByteSize::get);
        let tables = plan.config().plugins.clone();
        let pool = build::build(py, plan, progress)?;
        let report = pool.report();
        let info = Info {
            addr: pool.region().map_or(0, |r| r.addr() as usize),
            nbytes: report.logical_bytes,
            mapped: report.mapped_bytes,
            page: report.page_size,
            backing: report.backing.clone(),
            pinned: report.pin.status == PinStatus::Pinned,
            pin_reason: report.pin.reason.clone(),
            // This rank's shard as the pool came: a shared pool's or a
            // lease's ranks' (of the keeper's size), else the whole pool.
            shard: report
                .sharing
                .as_ref()
                .map_or((0, report.mapped_bytes), |s| (s.shard.offset, s.shard.len)),
            block_size,
            tables,
        };
        let exports = Exports::new(
            info.addr,
            usize::try_from(info.nbytes).unwrap_or(usize::MAX),
        );
        Ok(PyClassInitializer::from(exports).add_subclass(PyPool {
            state: Mutex::new(State {
                pool: Some(pool),
                closed: None,
                placeholder: None,
                before_close: Vec::new(),
            }),
            info,
            tier: Mutex::new(None),
        }))
    }

    fn plan(py: Python<'_>, config: Result<pool_core::PoolConfig, Error>) -> PyResult<PoolPlan> {
        let config = config.map_err(|e| errors::to_py(py, &e, None))?;
        let plan = py.detach(|| PoolPlan::new(config));
        logs::flush(py);
        plan.map_err(|e| errors::to_py(py, &e, None))
    }

    /// Tear down, keeping the address range (see [`State::placeholder`]).
    fn teardown(py: Python<'_>, pool: Pool) -> (PoolReport, Option<pool_core::Placeholder>) {
        let torn = py.detach(|| pool.teardown_keeping_range());
        logs::flush(py);
        torn
    }
}

/// A fingerprint as given (a dict, or anything with `items()`): its
/// fields and values as strings, in order.
fn fingerprint_fields(fingerprint: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    fingerprint
        .call_method0("items")?
        .try_iter()?
        .map(|kv| {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = kv?.extract()?;
            Ok((k.str()?.to_string(), v.str()?.to_string()))
        })
        .collect()
}

/// How long a tier request waits for the keeper's answer unless told: the
/// Python methods' default (an engine's manager passes its own bound).
const TIER_WAIT_DEFAULT: f64 = 30.0;

impl PyPool {
    /// Run `f` on the link to this leased pool's keeper's tier, made on
    /// first use from a duplicate of the lease's connection, with the GIL
    /// released (the pool's lock is not held while it waits).
    fn with_link<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut TierLink) -> T + Send,
    ) -> PyResult<T> {
        let made = self
            .tier
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !made {
            let conn = {
                let state = self.lock();
                let conn = state.pool.as_ref().and_then(Pool::keeper_conn);
                let conn = conn.ok_or_else(|| {
                    errors::raise(
                        py,
                        errors::Kind::Config,
                        "the tier is a keeper's: this pool is not leased from one \
                         (keeper=\"NAME\"), or is closed"
                            .into(),
                    )
                })?;
                conn.try_clone_to_owned().map_err(|e| {
                    errors::raise(
                        py,
                        errors::Kind::Error,
                        format!("dup of the lease's connection: {e}"),
                    )
                })?
            };
            let mut tier = self.tier.lock().unwrap_or_else(|p| p.into_inner());
            tier.get_or_insert_with(|| TierLink::new(conn));
        }
        let tier = &self.tier;
        py.detach(|| {
            let mut tier = tier.lock().unwrap_or_else(|p| p.into_inner());
            tier.as_mut().map(f)
        })
        .ok_or_else(|| errors::raise(py, errors::Kind::Error, "the pool is closed".into()))
    }

    /// Why the keeper's tier did not answer, as a `KeeperError`.
    fn unanswered(&self, py: Python<'_>, u: &Unanswered) -> PyErr {
        let e = Error::Keeper {
            name: self.keeper_name(),
            message: u.message.clone(),
            pid: None,
            absent: u.lost,
        };
        errors::to_py(py, &e, None)
    }

    /// Ask this leased pool's keeper's CPU tier, waiting up to `timeout`
    /// seconds: its reply as it came, refusals included.
    fn ask_tier_as_told(
        &self,
        py: Python<'_>,
        op: TierOp,
        timeout: Option<f64>,
    ) -> PyResult<TierReply> {
        let wait = timeout.unwrap_or(TIER_WAIT_DEFAULT);
        let wait = std::time::Duration::try_from_secs_f64(wait).map_err(|_| {
            errors::raise(
                py,
                errors::Kind::Config,
                format!("timeout={wait} must be a number of seconds, 0 or more"),
            )
        })?;
        self.with_link(py, |link| link.ask(op, wait))?
            .map_err(|u| self.unanswered(py, &u))
    }

    /// [`Self::ask_tier_as_told`], a refusal raised as a `hostpool.Error`.
    fn ask_tier(&self, py: Python<'_>, op: TierOp, timeout: Option<f64>) -> PyResult<TierReply> {
        match self.ask_tier_as_told(py, op, timeout)? {
            TierReply::Refused { message } => Err(errors::raise(py, errors::Kind::Error, message)),
            reply => Ok(reply),
        }
    }

    /// The kept pool's name, as its keeper told it (empty for a pool that
    /// is not leased).
    fn keeper_name(&self) -> String {
        let state = self.lock();
        let report = state.pool.as_ref().map(Pool::report);
        report
            .and_then(|r| r.keeper.as_ref())
            .map(|k| k.info.name.clone())
            .unwrap_or_default()
    }

    /// A completion, abort, release or touch: with `wait`, asked (how many
    /// of the slots or keys were this pool's); else told, not waited for
    /// (`None`).
    fn tier_done(
        &self,
        py: Python<'_>,
        op: TierOp,
        wait: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<u64>> {
        if !wait {
            self.with_link(py, |link| link.tell(op))?
                .map_err(|u| self.unanswered(py, &u))?;
            return Ok(None);
        }
        match self.ask_tier(py, op, timeout)? {
            TierReply::Done(n) => Ok(Some(n)),
            other => Err(unexpected(py, &other)),
        }
    }
}

impl PyPool {
    /// Open the tier (see `tier_open`), with what a rejoining tenant had.
    fn open_tier(
        slf: &Bound<'_, Self>,
        slots: u64,
        fingerprint: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        rejoin: Option<hostpool::hostpool_handoff::Rejoin>,
    ) -> PyResult<(
        crate::index::PyKvIndex,
        Option<hostpool::hostpool_handoff::Rejoined>,
    )> {
        let py = slf.py();
        let fields = fingerprint_fields(fingerprint)?;
        hostpool_index::Fingerprint::new(fields.clone())
            .map_err(|e| errors::raise(py, errors::Kind::Config, e.to_string()))?;
        let this = slf.get();
        let open = TierOp::Open {
            slots,
            fingerprint: fields.clone(),
            rejoin,
        };
        let (cold, rejoined) = match this.ask_tier_as_told(py, open, timeout)? {
            TierReply::Opened {
                warm: true,
                rejoined,
                ..
            } => (None, rejoined),
            TierReply::Opened {
                reason,
                field,
                rejoined,
                ..
            } => (
                Some(crate::index::ColdStart {
                    reason: reason
                        .unwrap_or_else(|| "the keeper formatted the index afresh".into()),
                    field,
                }),
                rejoined,
            ),
            TierReply::Refused { message } => {
                let e = Error::Keeper {
                    name: this.keeper_name(),
                    message,
                    pid: None,
                    absent: false,
                };
                return Err(errors::to_py(py, &e, None));
            }
            other => {
                return Err(errors::raise(
                    py,
                    errors::Kind::Error,
                    format!("the keeper's tier answered {other:?} to an open"),
                ));
            }
        };
        let index = crate::index::PyKvIndex::opened(
            (slf.as_any(), PyPool::reach),
            slots,
            fields,
            (this.info.mapped, this.info.page),
            cold,
        )?;
        Ok((index, rejoined))
    }
}

/// A tier reply of the wrong kind.
fn unexpected(py: Python<'_>, reply: &TierReply) -> PyErr {
    errors::raise(
        py,
        errors::Kind::Error,
        format!("the keeper's tier answered {reply:?}"),
    )
}

#[pymethods]
impl PyPool {
    #[new]
    #[pyo3(signature = (
        size = None, *, backing = "auto", dir = None, page_size = None, numa_node = None,
        threads = None, prefault = Parsed(PrefaultChoice::Auto), block_size = None, shared = None, pin = None,
        pin_required = false, register = None, pin_scope = Parsed(PinScope::Pool),
        memlock_bound = Parsed(MemlockPolicy::Check),
        pin_background = false, background_chunk = None, huge_pages = None, keeper = None, keeper_tag = None,
        keeper_fallback = Parsed(pool_core::KeeperFallback::Fail), keeper_attach_timeout = None,
        progress = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        size: Option<&Bound<'_, PyAny>>,
        backing: &str,
        dir: Option<&Bound<'_, PyAny>>,
        page_size: Option<&Bound<'_, PyAny>>,
        numa_node: Option<&Bound<'_, PyAny>>,
        threads: Option<i64>,
        prefault: Parsed<PrefaultChoice>,
        block_size: Option<&Bound<'_, PyAny>>,
        shared: Option<PyRef<'_, PyShared>>,
        pin: Option<String>,
        pin_required: bool,
        register: Option<&Bound<'_, PyAny>>,
        pin_scope: Parsed<PinScope>,
        memlock_bound: Parsed<MemlockPolicy>,
        pin_background: bool,
        background_chunk: Option<&Bound<'_, PyAny>>,
        huge_pages: Option<Parsed<pool_core::HugePages>>,
        keeper: Option<String>,
        keeper_tag: Option<String>,
        keeper_fallback: Parsed<pool_core::KeeperFallback>,
        keeper_attach_timeout: Option<f64>,
        progress: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<PyPool>> {
        let config = (|| {
            let asked = opt_size("size", size)?;
            let args = Args {
                size_given: asked.is_some(),
                huge_pages: huge_pages.map(|h| h.0),
                size: asked.unwrap_or(pool_core::ByteSize::gib(1)),
                keeper,
                keeper_tag,
                keeper_fallback: keeper_fallback.0,
                keeper_attach_timeout,
                backing: backing.to_string(),
                dir: match dir {
                    Some(d) if !d.is_none() => Some(config::path("dir", d)?),
                    _ => None,
                },
                page_size: opt_size("page_size", page_size)?,
                numa_node: numa_node
                    .filter(|n| !n.is_none())
                    .map(config::numa_node)
                    .transpose()?,
                threads: threads.map(config::threads).transpose()?,
                prefault: prefault.0,
                block_size: opt_size("block_size", block_size)?,
                sharing: shared.map(|s| s.config()).transpose()?,
                pin,
                pin_required,
                pin_scope: pin_scope.0,
                pin_background,
                background_chunk: opt_size("background_chunk", background_chunk)?,
                memlock_bound: memlock_bound.0,
                register: match register {
                    Some(r) if !r.is_none() => config::register(r)?,
                    _ => Vec::new(),
                },
            };
            args.into_config()
        })();
        if let Some(cb) = &progress
            && !cb.is_callable()
        {
            return Err(errors::raise(
                py,
                errors::Kind::Config,
                "invalid configuration: `progress` must be a callable taking (phase, done_bytes, total_bytes)".into(),
            ));
        }
        let plan = PyPool::plan(py, config)?;
        PyPool::from_plan(py, plan, progress)
    }

    /// Build a pool from a config file (TOML or JSON) or a dict of its keys.
    #[staticmethod]
    #[pyo3(signature = (source, *, progress = None))]
    fn from_config(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        progress: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyPool>> {
        let plan = PyPool::plan(py, config::from_source(source))?;
        Py::new(py, PyPool::from_plan(py, plan, progress)?)
    }

    /// The pool's base address.
    #[getter]
    fn addr(&self) -> usize {
        self.info.addr
    }

    /// Bytes asked for (the logical size; the buffer's length).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.info.nbytes
    }

    /// Bytes mapped (the size rounded up to the page).
    #[getter]
    fn mapped_bytes(&self) -> u64 {
        self.info.mapped
    }

    /// Page size in bytes.
    #[getter]
    fn page_size(&self) -> u64 {
        self.info.page
    }

    /// The backing's name.
    #[getter]
    fn backing(&self) -> &str {
        &self.info.backing
    }

    /// Whether the pool is pinned (all of it: a background pin is pinned
    /// once it has finished).
    #[getter]
    fn pinned(&self) -> bool {
        let state = self.lock();
        match &state.pool {
            Some(pool) => pool.pin_status().status == pool_core::PinStatus::Pinned,
            None => self.info.pinned,
        }
    }

    /// Pause a background pin between chunks (the chunk being pinned
    /// finishes first), to keep the driver to the engine's own transfers
    /// for a while; `resume_pinning()` goes on. `True` when a background
    /// pin was running, `False` when there is nothing to pause.
    fn pause_pinning(&self) -> bool {
        self.lock().pool.as_ref().is_some_and(Pool::pause_pinning)
    }

    /// Resume a background pin paused by `pause_pinning()`. `True` when one
    /// was running.
    fn resume_pinning(&self) -> bool {
        self.lock().pool.as_ref().is_some_and(Pool::resume_pinning)
    }

    /// Where the pin stands, as a dict: `state` (`off`, `pinning`,
    /// `pinned`, `failed`, `skipped`), `pinned_bytes`, `total_bytes`,
    /// `ranges` (pinned `{offset, len}`, in address order), `chunks`,
    /// `error`, `background`, `paused`, `parked` (the pinning thread waits in the
    /// pause, the chunk in flight at the pause done), `seconds`.
    fn pin_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let progress = {
            let state = self.lock();
            match (&state.pool, &state.closed) {
                (Some(pool), _) => pool.pin_status(),
                (None, _) => pool_core::PinProgress::settled(
                    pool_core::PinStatus::Off,
                    None,
                    Some("the pool is closed".into()),
                    0.0,
                ),
            }
        };
        json_dict(py, "the pin status", &progress)
    }

    /// Wait (without the GIL) until the pin is settled, at most `timeout`
    /// seconds (`None`: as long as it takes); returns `pin_status()`.
    /// Raises `PinError` when a required background pin failed (nothing
    /// stays pinned); Ctrl-C raises `KeyboardInterrupt`.
    #[pyo3(signature = (timeout = None))]
    fn wait_pinned<'py>(
        slf: &Bound<'py, Self>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if timeout.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
            return Err(PyValueError::new_err(
                "timeout must be a number of seconds, 0 or more, or None",
            ));
        }
        let deadline = timeout
            .map(|t| std::time::Instant::now() + std::time::Duration::from_secs_f64(t.min(1e9)));
        loop {
            let slice = std::time::Duration::from_millis(50);
            let wait = match deadline {
                Some(d) => d
                    .saturating_duration_since(std::time::Instant::now())
                    .min(slice),
                None => slice,
            };
            let outcome = py.detach(|| {
                let state = this.lock();
                state.pool.as_ref().map(|p| p.wait_pinned(Some(wait)))
            });
            logs::flush(py);
            let progress = match outcome {
                None => return this.pin_status(py),
                Some(Err(e)) => return Err(errors::to_py(py, &e, Some(pool_core::Phase::Pin))),
                Some(Ok(p)) => p,
            };
            let over = deadline.is_some_and(|d| std::time::Instant::now() >= d);
            if progress.status != pool_core::PinStatus::Pinning || over {
                return json_dict(py, "the pin status", &progress);
            }
            py.check_signals()?;
        }
    }

    /// Why a best-effort pin was skipped (`None` when pinned or not asked for).
    #[getter]
    fn pin_reason(&self) -> Option<&str> {
        self.info.pin_reason.as_deref()
    }

    /// `(offset, nbytes)` of this rank's prefault shard (the whole pool when private).
    #[getter]
    fn shard(&self) -> (u64, u64) {
        self.info.shard
    }

    /// The caller's block size given at build (`None` when not given):
    /// registration chunks never split a block; allocators align to it.
    #[getter]
    fn block_size(&self) -> Option<u64> {
        self.info.block_size
    }

    /// Whether `close()` has run.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().pool.is_none()
    }

    /// The report, as `hostpool alloc --json` prints it (with teardown once closed).
    #[getter]
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self.lock();
        match (&state.pool, &state.closed) {
            (Some(pool), _) => json_dict(py, "the report", pool.report()),
            (None, Some(report)) => json_dict(py, "the report", report),
            (None, None) => Ok(py.None().into_bound(py)),
        }
    }

    /// Tear the pool down (deregister, unpin, unmap, unlink) and return the
    /// steps that could not be undone, each `{"step": ..., "detail": ...}`
    /// (empty when clean). Idempotent. Raises `PoolBusyError` while buffers
    /// or tensors exported from the pool are alive, leaving it intact.
    fn close<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let this = slf.get();
        let busy = |alive: usize| {
            errors::raise(
                py,
                errors::Kind::PoolBusy,
                format!(
                    "cannot close the pool: {alive} export(s) of its memory are alive \
                     (memoryview, numpy array, torch tensor or DLPack capsule); delete \
                     them (del tensor) and close again"
                ),
            )
        };
        // What registered the memory elsewhere is undone first, last first,
        // once nothing exported stands in the way (a refused close undoes
        // nothing); its failures are teardown issues, as the pool's own.
        let undo = {
            let mut state = this.lock();
            if state.pool.is_none() {
                return Ok(PyList::empty(py));
            }
            slf.as_super().get().alive().map_err(busy)?;
            std::mem::take(&mut state.before_close)
        };
        let mut undone = Vec::new();
        for callback in undo.iter().rev() {
            if let Err(e) = callback.call0(py) {
                let detail = e
                    .value(py)
                    .str()
                    .map_or_else(|_| e.to_string(), |s| s.to_string());
                undone.push(pool_core::TeardownIssue::log("before close", detail));
            }
        }
        let pool = {
            let mut state = this.lock();
            if let Err(alive) = slf.as_super().get().close() {
                state.before_close = undo;
                return Err(busy(alive));
            }
            state.pool.take()
        };
        // The tier's link holds a duplicate of the lease's connection: it
        // goes with the pool, or the keeper would see this engine live on.
        let tier = &this.tier;
        py.detach(|| tier.lock().unwrap_or_else(|p| p.into_inner()).take());
        let Some(pool) = pool else {
            return Ok(PyList::empty(py));
        };
        let (mut report, kept) = PyPool::teardown(py, pool);
        report.teardown_issues.splice(0..0, undone);
        let issues = PyList::empty(py);
        for issue in &report.teardown_issues {
            let d = PyDict::new(py);
            d.set_item("step", &issue.step)?;
            d.set_item("detail", &issue.detail)?;
            issues.append(d)?;
        }
        let mut state = this.lock();
        state.closed = Some(report);
        state.placeholder = kept;
        Ok(issues)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Close; while an exception propagates out of the `with` block and
    /// exports of the pool are still alive (held by its traceback's frames),
    /// that exception is raised, not `PoolBusyError`: the pool is then torn
    /// down once the last export and the pool itself are collected.
    #[pyo3(signature = (exc_type, _exc_value, _traceback))]
    fn __exit__(
        slf: &Bound<'_, Self>,
        exc_type: &Bound<'_, PyAny>,
        _exc_value: &Bound<'_, PyAny>,
        _traceback: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let py = slf.py();
        match PyPool::close(slf) {
            Err(busy) if !exc_type.is_none() => {
                tracing::warn!(
                    "the pool was not closed at the end of its `with` block, which an exception \
                     left while exports of its memory were alive ({busy}); it is torn down when \
                     they and the pool are collected"
                );
                logs::flush(py);
                Ok(false)
            }
            other => other.map(|_| false),
        }
    }

    /// The pool as NIXL descriptors `(addr, len, dev_id)`, split at
    /// `max_region` bytes (default: one region) on block boundaries, as the
    /// `nixl` registrar splits it: what an engine's own
    /// `nixl_agent.register_memory(descs, "DRAM")` takes.
    #[pyo3(signature = (dev_id = 0, max_region = None))]
    fn nixl_descs(
        &self,
        py: Python<'_>,
        dev_id: u64,
        max_region: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(u64, u64, u64)>> {
        if self.closed() {
            return Err(errors::raise(
                py,
                errors::Kind::Error,
                "the pool is closed: it has no memory to describe".into(),
            ));
        }
        let regions = (|| {
            let max = opt_size("max_region", max_region)?.map(pool_core::ByteSize::get);
            let page = pool_core::PageSize::new(self.info.page)?;
            registrar_nixl::regions(
                self.info.mapped,
                page,
                self.info.block_size.unwrap_or(self.info.page),
                max,
            )
        })()
        .map_err(|e| errors::to_py(py, &e, None))?;
        let base = self.info.addr as u64;
        Ok(regions
            .iter()
            .map(|r| (base + r.offset, r.len, dev_id))
            .collect())
    }

    /// This rank's shard of the pool (the whole pool when private) as
    /// `(addr, len)` regions for a registration elsewhere (Mooncake): split
    /// at `max_region` bytes (default: one region) on boundaries that never
    /// split a block (`block_size`) or a page.
    #[pyo3(signature = (max_region = None))]
    fn regions(
        &self,
        py: Python<'_>,
        max_region: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(u64, u64)>> {
        if self.closed() {
            return Err(errors::raise(
                py,
                errors::Kind::Error,
                "the pool is closed: it has no memory to register".into(),
            ));
        }
        let (offset, len) = self.info.shard;
        let page = self.info.page;
        let block = self.info.block_size.unwrap_or(page);
        let max = opt_size("max_region", max_region)
            .map_err(|e| errors::to_py(py, &e, None))?
            .map(pool_core::ByteSize::get);
        let unit = pool_core::lcm(page, block).unwrap_or(u64::MAX);
        let config = |message: String| errors::raise(py, errors::Kind::Config, message);
        if let Some(max) = max
            && max < unit
        {
            return Err(config(format!(
                "max_region of {} is smaller than one {} (a block of {} on {} pages), which a \
                 region must never split; give max_region of at least {}, or a smaller block",
                pool_core::format_bytes(max),
                pool_core::format_bytes(unit),
                pool_core::format_bytes(block),
                pool_core::format_bytes(page),
                pool_core::format_bytes(unit),
            )));
        }
        if offset % unit != 0 {
            return Err(config(format!(
                "this rank's shard starts at offset {offset}, inside a block of {} on {} pages: \
                 give the shared pool a block size that divides its shards",
                pool_core::format_bytes(block),
                pool_core::format_bytes(page),
            )));
        }
        let regions = (|| {
            let page = pool_core::PageSize::new(page)?;
            Ok::<_, Error>(pool_core::mr_regions(
                len,
                page,
                block,
                max.unwrap_or(len.max(1)),
            )?)
        })()
        .map_err(|e| errors::to_py(py, &e, None))?;
        let base = self.info.addr as u64 + offset;
        Ok(regions.iter().map(|r| (base + r.offset, r.len)).collect())
    }

    /// The open files the pool's memory is, in pool order, as `(fd,
    /// offset, nbytes, path)`: the file descriptor (valid until `close()`),
    /// where the file starts in the pool (mapped from its own offset 0), its
    /// length, and its path while linked (`None` for an unlinked file or a
    /// memfd: open `/proc/self/fd/FD`). Empty for anonymous memory.
    fn files(&self, py: Python<'_>) -> PyResult<Vec<PoolFileRow>> {
        use std::os::fd::AsRawFd;
        let state = self.lock();
        let pool = state.pool.as_ref().ok_or_else(|| {
            errors::raise(
                py,
                errors::Kind::Error,
                "the pool is closed: it has no files".into(),
            )
        })?;
        Ok(pool
            .pool_files()
            .iter()
            .map(|f| {
                (
                    f.fd.as_raw_fd(),
                    f.extent.offset,
                    f.extent.len,
                    f.path.as_ref().map(|p| p.display().to_string()),
                )
            })
            .collect())
    }

    /// The config's table `[name]` as given (a dict), or `None`: settings
    /// an embedder reads (`[mooncake] max_region`).
    fn plugin_table<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        match self.info.tables.get(name) {
            Some(table) => json_dict(py, "the table", table),
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// Run `callback()` at the start of `close()`, before the memory goes
    /// (callbacks run last first; one that raises becomes a teardown
    /// issue). For what registered the pool elsewhere: `hostpool.mooncake`.
    fn _before_close(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        let mut state = self.lock();
        if state.pool.is_none() {
            return Err(errors::raise(
                py,
                errors::Kind::Error,
                "the pool is closed".into(),
            ));
        }
        state.before_close.push(callback);
        Ok(())
    }

    /// Forget a callback given to `_before_close` (one equal to it); whether
    /// it was there.
    fn _forget_before_close(&self, py: Python<'_>, callback: &Bound<'_, PyAny>) -> bool {
        let mut state = self.lock();
        let before = state.before_close.len();
        // Bound methods are made anew at each access: compare by equality.
        state
            .before_close
            .retain(|c| !c.bind(py).eq(callback).unwrap_or(false));
        state.before_close.len() != before
    }

    /// Ask the CPU tier of this pool's keeper (a keeper of `--tenants N`
    /// shares one tier between its engines) for a slot to store each of
    /// `keys` in: per key `("granted", slot, evicted key or None)`,
    /// `("stored", slot, None)`, `("in_flight", None, None)` (another store
    /// of it is being written) or `("no_room", None, None)`. Write a
    /// granted slot's bytes, then `tier_stored`.
    ///
    /// Every `tier_*` request waits at most `timeout` seconds (30 unless
    /// given) for the keeper, with the GIL released; `KeeperError` when it
    /// did not answer in time (slots it grants later are given back by
    /// themselves), is away (asked again at most once a second) or is gone
    /// (`absent` true). `tier_link` says which.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (keys, *, timeout = None))]
    fn tier_store(
        &self,
        py: Python<'_>,
        keys: Vec<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(&'static str, Option<u64>, Option<Vec<u8>>)>> {
        match self.ask_tier(py, TierOp::Store { keys }, timeout)? {
            TierReply::Puts(puts) => Ok(puts
                .into_iter()
                .map(|p| match p {
                    TierPut::Granted { slot, evicted } => ("granted", Some(slot), evicted),
                    TierPut::Stored { slot } => ("stored", Some(slot), None),
                    TierPut::InFlight => ("in_flight", None, None),
                    TierPut::NoRoom => ("no_room", None, None),
                })
                .collect()),
            other => Err(unexpected(py, &other)),
        }
    }

    /// The granted `slots` are written completely: the tier records them
    /// (a hit for every tenant from now on). How many were this pool's;
    /// with `wait=False`, sent without waiting for the keeper (`None`).
    #[pyo3(signature = (slots, *, wait = true, timeout = None))]
    fn tier_stored(
        &self,
        py: Python<'_>,
        slots: Vec<u64>,
        wait: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<u64>> {
        self.tier_done(py, TierOp::Stored { slots }, wait, timeout)
    }

    /// The granted `slots` will not be written: free again.
    #[pyo3(signature = (slots, *, wait = true, timeout = None))]
    fn tier_abort(
        &self,
        py: Python<'_>,
        slots: Vec<u64>,
        wait: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<u64>> {
        self.tier_done(py, TierOp::Abort { slots }, wait, timeout)
    }

    /// Hold each of `keys`' slot for a load (never evicted or overwritten
    /// until `tier_loaded`): the slot, or None for a miss.
    #[pyo3(signature = (keys, *, timeout = None))]
    fn tier_load(
        &self,
        py: Python<'_>,
        keys: Vec<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Option<u64>>> {
        match self.ask_tier(py, TierOp::Load { keys }, timeout)? {
            TierReply::Loads(slots) => Ok(slots),
            other => Err(unexpected(py, &other)),
        }
    }

    /// Hold `key`'s slot for a load and, in the same message, up to `ahead`
    /// of the blocks stored after it (each in the store batch of the one
    /// before: a request's next blocks), while they are recorded: the
    /// `(key, slot)` pairs held, `key`'s first; empty for a miss. Release
    /// each with `tier_loaded` once read, or `tier_release` unread.
    #[pyo3(signature = (key, ahead = 0, *, timeout = None))]
    fn tier_hold(
        &self,
        py: Python<'_>,
        key: Vec<u8>,
        ahead: u32,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(Vec<u8>, u64)>> {
        match self.ask_tier(py, TierOp::Hold { key, ahead }, timeout)? {
            TierReply::Held(held) => Ok(held),
            other => Err(unexpected(py, &other)),
        }
    }

    /// The held `slots` were read: their holds released (counted as this
    /// engine's hits in `keep status`).
    #[pyo3(signature = (slots, *, wait = true, timeout = None))]
    fn tier_loaded(
        &self,
        py: Python<'_>,
        slots: Vec<u64>,
        wait: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<u64>> {
        self.tier_done(py, TierOp::Loaded { slots }, wait, timeout)
    }

    /// The held `slots` were not read after all: their holds released, not
    /// counted as hits.
    #[pyo3(signature = (slots, *, wait = true, timeout = None))]
    fn tier_release(
        &self,
        py: Python<'_>,
        slots: Vec<u64>,
        wait: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<u64>> {
        self.tier_done(py, TierOp::Release { slots }, wait, timeout)
    }

    /// `keys` were used: the newest in the tier's one order of last use.
    #[pyo3(signature = (keys, *, wait = true, timeout = None))]
    fn tier_touch(
        &self,
        py: Python<'_>,
        keys: Vec<Vec<u8>>,
        wait: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<u64>> {
        self.tier_done(py, TierOp::Touch { keys }, wait, timeout)
    }

    /// Hand this pool's files back to the keeper of `keeper`, a keeper
    /// restarted with neither systemd's file descriptor store nor a persist
    /// directory that waits for them (`adopt_within_secs`): `True` when it
    /// took them back (the same memory, its bytes and index), `False` when
    /// it did not (it has its pool already, or they are not the pool its
    /// config plans). The GIL and the pool's lock are not held meanwhile.
    fn hand_back(&self, py: Python<'_>, keeper: &str) -> PyResult<bool> {
        let files: Vec<(std::os::fd::OwnedFd, pool_core::Extent)> = {
            let state = self.lock();
            let pool = state.pool.as_ref().ok_or_else(|| {
                errors::raise(py, errors::Kind::Error, "the pool is closed".into())
            })?;
            pool.pool_files()
                .iter()
                .map(|f| Ok((f.fd.try_clone()?, f.extent)))
                .collect::<std::io::Result<_>>()
                .map_err(|e| errors::raise(py, errors::Kind::Error, format!("dup: {e}")))?
        };
        let keeper = keeper.to_string();
        py.detach(move || {
            let borrowed: Vec<(std::os::fd::BorrowedFd<'_>, pool_core::Extent)> = files
                .iter()
                .map(|(fd, e)| (std::os::fd::AsFd::as_fd(fd), *e))
                .collect();
            hostpool::hostpool_handoff::lease::hand_back(&keeper, &borrowed)
        })
        .map_err(|e| errors::to_py(py, &e, None))
    }

    /// How the link to this leased pool's keeper's tier is: `("up", None)`,
    /// `("away", why)` (it did not answer within a request's timeout, or
    /// does not read), `("lost", why)` (it ended), or `("none", None)`
    /// before the first tier request.
    #[getter]
    fn tier_link(&self, py: Python<'_>) -> (&'static str, Option<String>) {
        let tier = &self.tier;
        py.detach(|| {
            let mut tier = tier.lock().unwrap_or_else(|p| p.into_inner());
            match tier.as_mut() {
                None => ("none", None),
                Some(link) => {
                    link.take_answers();
                    match link.state() {
                        LinkState::Up => ("up", None),
                        LinkState::Away { why, .. } => ("away", Some(why.clone())),
                        LinkState::Lost(why) => ("lost", Some(why.clone())),
                    }
                }
            }
        })
    }

    /// Open the CPU tier of this pool's keeper for this engine's identity:
    /// `slots` slots and `fingerprint` (an ordered dict of the fields that
    /// decide what a slot's bytes mean, as for `index`). The keeper
    /// attaches the index at the pool's tail itself: warm with its records
    /// when it holds this identity, else formatted afresh (`cold_reason`,
    /// `cold_field` say what it found). The returned `KvIndex` reads it in
    /// place (`find`, `get`, `len`); the keeper alone writes it (store with
    /// `tier_store` and `tier_stored`). `KeeperError` when another engine
    /// in the tier opened it for another identity (the keeper's message
    /// names the field, both values and that engine) or the pool cannot
    /// hold the index.
    #[pyo3(signature = (slots, fingerprint, *, timeout = None))]
    fn tier_open(
        slf: &Bound<'_, Self>,
        slots: u64,
        fingerprint: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<crate::index::PyKvIndex> {
        PyPool::open_tier(slf, slots, fingerprint, timeout, None).map(|(index, _)| index)
    }

    /// `tier_open` for an engine that comes back after its keeper's
    /// restart (it leased the restarted keeper's pool, the same memory it
    /// maps): `writing`, its stores in flight as `(slot, key)` (granted by
    /// the keeper before), and `holding`, the keys it holds for loads, are
    /// given back to it before any other engine can be granted those
    /// slots. `(index, claimed, held)`: the slots of its stores in flight
    /// that are its to write again (complete or abort them as usual; the
    /// others are not its any more) and its holds taken again,
    /// `(key, slot)` (release each as usual).
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (slots, fingerprint, writing, holding, *, timeout = None))]
    fn tier_rejoin(
        slf: &Bound<'_, Self>,
        slots: u64,
        fingerprint: &Bound<'_, PyAny>,
        writing: Vec<(u64, Vec<u8>)>,
        holding: Vec<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<(crate::index::PyKvIndex, Vec<u64>, Vec<(Vec<u8>, u64)>)> {
        let rejoin = hostpool::hostpool_handoff::Rejoin { writing, holding };
        let (index, back) = PyPool::open_tier(slf, slots, fingerprint, timeout, Some(rejoin))?;
        let back = back.unwrap_or_default();
        Ok((index, back.claimed, back.held))
    }

    /// The crash-consistent index of what this pool's `slots` hold (a
    /// kept pool's, read back by the next engine): attached at `offset`
    /// (default: the pool's last `hostpool.index_bytes(slots, page_size)`
    /// bytes) for the identity `fingerprint` (an ordered dict of the
    /// fields that decide what a slot's bytes mean). Warm with its
    /// records when the identity and the slots are the same; otherwise
    /// cold (emptied), saying why (`cold_reason`, `cold_field`).
    #[pyo3(signature = (slots, fingerprint, *, offset = None))]
    fn index(
        slf: &Bound<'_, Self>,
        slots: u64,
        fingerprint: &Bound<'_, PyAny>,
        offset: Option<u64>,
    ) -> PyResult<crate::index::PyKvIndex> {
        let py = slf.py();
        let fields = fingerprint_fields(fingerprint)?;
        let this = slf.get();
        let len = crate::index::index_bytes(slots, this.info.page)?;
        let offset = match offset {
            Some(o) => o,
            None => this.info.mapped.checked_sub(len).ok_or_else(|| {
                errors::raise(
                    py,
                    errors::Kind::Config,
                    format!(
                        "an index of {slots} slots takes {len} bytes, more than the pool's {}",
                        this.info.mapped
                    ),
                )
            })?,
        };
        crate::index::PyKvIndex::attach(
            (slf.as_any(), PyPool::reach),
            (slots, offset),
            fields,
            (this.info.mapped, this.info.page),
        )
    }

    /// A writable memoryview of `nbytes` bytes at `offset` (zero copy).
    fn view<'py>(slf: &Bound<'py, Self>, offset: u64, nbytes: u64) -> PyResult<Bound<'py, PyAny>> {
        let total = slf.get().info.nbytes;
        if offset.checked_add(nbytes).is_none_or(|end| end > total) {
            return Err(PyValueError::new_err(format!(
                "view({offset}, {nbytes}) is outside the pool of {total} bytes"
            )));
        }
        let py = slf.py();
        let whole = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((slf,))?;
        let slice = pyo3::types::PySlice::new(
            py,
            isize::try_from(offset).unwrap_or(isize::MAX),
            isize::try_from(offset + nbytes).unwrap_or(isize::MAX),
            1,
        );
        let part = whole.get_item(slice)?;
        // The slice holds its own export; let go of the whole one.
        whole.call_method0("release")?;
        Ok(part)
    }

    /// DLPack: a capsule of this pool's memory as a 1-D `uint8` CPU tensor.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream; // host memory: there is no stream to order against
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "a hostpool pool is exported without copying: copy=True is not supported",
            ));
        }
        if let Some(device) = dl_device
            && device != crate::sys::DLPACK_CPU
        {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "a hostpool pool is host memory (kDLCPU, device (1, 0)), not device {device:?}"
            )));
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        crate::sys::dlpack(slf.as_super(), versioned)
    }

    /// `(kDLCPU, 0)`: host memory. (torch rejects `kDLCUDAHost` for host memory, even pinned.)
    fn __dlpack_device__(&self) -> (i32, i32) {
        crate::sys::DLPACK_CPU
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.info.nbytes).unwrap_or(usize::MAX)
    }

    /// A pool is memory of this process: it cannot be pickled.
    fn __reduce__(&self) -> PyResult<()> {
        Err(pyo3::exceptions::PyTypeError::new_err(
            "a hostpool.Pool cannot be pickled: its memory belongs to this process. To share it \
             with other processes (tensor-parallel ranks), give each one the same \
             hostpool.Shared(name, world, rank) and build the pool there; a Shared pickles",
        ))
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        format!(
            "<hostpool.Pool {} bytes at {:#x}, backing {}, {} pages, {}{}>",
            self.info.nbytes,
            self.info.addr,
            self.info.backing,
            pool_core::format_bytes(self.info.page),
            if self.info.pinned { "pinned, " } else { "" },
            state
        )
    }
}

impl Drop for PyPool {
    fn drop(&mut self) {
        let pool = self
            .state
            .get_mut()
            .map_or_else(|p| p.into_inner().pool.take(), |s| s.pool.take());
        if let Some(pool) = pool {
            tracing::info!(
                "a hostpool.Pool of {} bytes was collected without close(); tearing it down",
                self.info.nbytes
            );
            // Collected: nothing refers to the pool any more, so its range
            // is unmapped at once.
            // Collection may run while an exception is being raised (a
            // temporary pool dropped as `pickle.dumps(Pool(...))` fails):
            // the logging call below must neither see nor clear it, or
            // Python reports "error return without exception set".
            Python::attach(|py| {
                let pending = PyErr::take(py);
                drop(PyPool::teardown(py, pool));
                if let Some(e) = pending {
                    e.restore(py);
                }
            });
        }
    }
}
