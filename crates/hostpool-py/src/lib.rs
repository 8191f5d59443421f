//! `hostpool._hostpool`: the Python binding of hostpool (pyo3, abi3 for
//! Python 3.11+). The `hostpool` package re-exports it; see
//! `python/hostpool/_hostpool.pyi` for the API as Python sees it.
//!
//! - `pool`: `Pool` (build, attributes, zero-copy exports, close) and `Shared`;
//! - `config`: keyword arguments and `from_config` into a [`PoolConfig`](pool_core::PoolConfig);
//! - `build`: the build on a thread of its own while the caller waits
//!   without the GIL, delivering progress and Ctrl-C;
//! - `errors`: the `hostpool` exception classes, and each
//!   [`pool_core::Error`] as one of them;
//! - `logs`: `tracing` events to Python's `logging` (logger `hostpool`);
//! - `sys`: the buffer protocol and DLPack, the crate's only `unsafe`.

mod build;
mod config;
mod convert;
mod errors;
mod index;
mod logs;
mod pool;
mod shared;
mod sys;

use pyo3::prelude::*;
use pyo3::types::PyDict;

// Every built-in plugin, linked as in the CLI.
use hostpool as _;

/// The registered plugins: `{"backings": [...], "pinners": [...], "registrars": [...],
/// "adapters": [...]}`,
/// each entry a dict with `name`, `summary` and `origin`, as `hostpool plugins --json`.
#[pyfunction]
fn plugins(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    use pool_core::plugin::{self, PluginRecord};
    use pool_core::plugin::{AdapterPlugin, BackingPlugin, PinnerPlugin, RegistrarPlugin};
    fn entries<'py, T: PluginRecord>(py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let records = plugin::registry::<T>().map_err(|e| errors::to_py(py, &e, None))?;
        records
            .into_values()
            .map(|r| {
                let d = PyDict::new(py);
                d.set_item("name", r.name())?;
                d.set_item("summary", r.summary())?;
                d.set_item("origin", r.origin())?;
                Ok(d)
            })
            .collect()
    }
    let out = PyDict::new(py);
    out.set_item("backings", entries::<BackingPlugin>(py)?)?;
    out.set_item("pinners", entries::<PinnerPlugin>(py)?)?;
    out.set_item("registrars", entries::<RegistrarPlugin>(py)?)?;
    out.set_item("adapters", entries::<AdapterPlugin>(py)?)?;
    Ok(out)
}

/// Check a pool config (a path to a TOML or JSON file, or a dict of its
/// keys) as `Pool.from_config` does, building nothing: it is parsed and
/// planned (plugins chosen, tables and sizes checked), and nothing is mapped,
/// created or reserved. Raises `ConfigError` naming an unknown key, plugin or
/// bad value. Engines call it where they read their own config, long before
/// a pool is built.
#[pyfunction]
fn check_config(py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<()> {
    let config = config::from_source(source).map_err(|e| errors::to_py(py, &e, None))?;
    let plan = py.detach(|| pool_core::PoolPlan::new(config));
    logs::flush(py);
    plan.map(drop).map_err(|e| errors::to_py(py, &e, None))
}

/// Plan a pool config as `hostpool plan --json` does, building nothing: the
/// backing and why, sizes, prefault, pin and registration plans, and every
/// capacity check with its `need`, `free` and `verdict` (`fits` says whether
/// all pass). Raises `ConfigError` for a bad config; a pool that does not fit
/// is a plan with `fits = False`, not an error.
#[pyfunction]
fn plan<'py>(py: Python<'py>, source: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let config = config::from_source(source).map_err(|e| errors::to_py(py, &e, None))?;
    let plan = py.detach(|| pool_core::PoolPlan::new(config));
    logs::flush(py);
    let plan = plan.map_err(|e| errors::to_py(py, &e, None))?;
    convert::json_dict(py, "the plan", &plan.report())
}

/// The bytes the index of `slots` slots takes in a pool of `page_size`-byte
/// pages (a whole number of pages): what to add to a pool that keeps one
/// (`Pool.index`).
#[pyfunction]
#[pyo3(signature = (slots, page_size = 4096))]
fn index_bytes(slots: u64, page_size: u64) -> PyResult<u64> {
    index::index_bytes(slots, page_size)
}

/// The status of the kept pool `name` as its keeper tells it (`hostpool
/// keep status --json`'s object): its size, page size, state, tenants and
/// their limit, the index at its tail. One request on the keeper's socket;
/// nothing is leased. Raises `KeeperError` when no keeper of that name
/// answers (saying how to start one).
#[pyfunction]
fn keeper_status<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let status = py.detach(|| hostpool::hostpool_handoff::lease::status(name));
    let status = status.map_err(|e| errors::to_py(py, &e, None))?;
    convert::json_dict(py, "the keeper's status", &status)
}

#[pymodule]
fn _hostpool(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logs::install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Whether this build reads HOSTPOOL_TEST_FAILPOINTS (test wheels only).
    m.add("_FAILPOINTS", pool_core::failpoint::ENABLED)?;
    // The exception classes (`hostpool/_errors.py` re-exports them).
    errors::add_classes(m)?;
    m.add_class::<pool::PyPool>()?;
    m.add_class::<shared::PyShared>()?;
    m.add_class::<index::PyKvIndex>()?;
    m.add_function(wrap_pyfunction!(index_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(plugins, m)?)?;
    m.add_function(wrap_pyfunction!(check_config, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(keeper_status, m)?)?;
    Ok(())
}
