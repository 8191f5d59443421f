//! `hostpool.Shared(name, world, rank)`: how a shared pool's ranks find
//! each other.

use pool_core::{Error, Rendezvous};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::config::Parsed;
use crate::errors;

/// How a shared pool's ranks find each other: `Shared(name, world, rank)`.
#[pyclass(module = "hostpool._hostpool", name = "Shared", frozen, eq, str)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyShared {
    /// The pool's name, the same for every rank.
    #[pyo3(get)]
    name: String,
    /// How many ranks share the pool.
    #[pyo3(get)]
    world: u32,
    /// This process's rank, 0 to world - 1.
    #[pyo3(get)]
    rank: u32,
    /// Seconds to wait for the creator and for ranks that never attach.
    #[pyo3(get)]
    attach_timeout: f64,
    /// Seconds to wait at the barrier for ranks that attached but have not arrived.
    #[pyo3(get)]
    barrier_timeout: f64,
    /// `"socket"` (default: nothing in any directory) or `"file"`.
    rendezvous: Rendezvous,
}

impl std::fmt::Display for PyShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Shared({:?}, world={}, rank={}, attach_timeout={}, barrier_timeout={}, rendezvous={:?})",
            self.name,
            self.world,
            self.rank,
            self.attach_timeout,
            self.barrier_timeout,
            self.rendezvous.to_string()
        )
    }
}

#[pymethods]
impl PyShared {
    #[new]
    #[pyo3(signature = (
        name, world, rank, attach_timeout = pool_core::DEFAULT_ATTACH_TIMEOUT_SECS,
        barrier_timeout = pool_core::DEFAULT_BARRIER_TIMEOUT_SECS,
        rendezvous = Parsed(Rendezvous::Socket),
    ))]
    fn new(
        py: Python<'_>,
        name: String,
        world: i64,
        rank: i64,
        attach_timeout: f64,
        barrier_timeout: f64,
        rendezvous: Parsed<Rendezvous>,
    ) -> PyResult<PyShared> {
        let shared = (|| {
            let world = u32::try_from(world).map_err(|_| {
                Error::config(format!(
                    "world {world} must be between 1 and {}",
                    pool_core::MAX_WORLD
                ))
            })?;
            let rank = u32::try_from(rank).map_err(|_| {
                Error::config(format!(
                    "rank {rank} must be 0 or more, below world {world}"
                ))
            })?;
            let shared = PyShared {
                name,
                world,
                rank,
                attach_timeout,
                barrier_timeout,
                rendezvous: rendezvous.0,
            };
            shared.config()?.validate()?;
            Ok(shared)
        })();
        shared.map_err(|e: Error| errors::to_py(py, &e, None))
    }

    fn __repr__(&self) -> String {
        self.to_string()
    }

    /// `"socket"` (default: nothing in any directory) or `"file"`.
    #[getter]
    fn rendezvous(&self) -> &'static str {
        pool_core::Choice::name(self.rendezvous)
    }

    /// Pickled as its arguments, so it can be passed to spawned ranks.
    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (Bound<'py, PyType>, (String, u32, u32, f64, f64, String)) {
        let s = slf.get();
        (
            slf.get_type(),
            (
                s.name.clone(),
                s.world,
                s.rank,
                s.attach_timeout,
                s.barrier_timeout,
                s.rendezvous.to_string(),
            ),
        )
    }
}

impl PyShared {
    pub(crate) fn config(&self) -> Result<pool_core::SharingConfig, Error> {
        Ok(pool_core::SharingConfig {
            name: self.name.clone(),
            world: self.world,
            rank: self.rank,
            attach_timeout_secs: self.attach_timeout,
            barrier_timeout_secs: self.barrier_timeout,
            rendezvous: self.rendezvous,
            control_dir: None,
        })
    }
}
