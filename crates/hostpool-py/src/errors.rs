//! Each [`pool_core::Error`] as the `hostpool` exception that names its
//! kind, with the CLI's message: the error and its causes in one paragraph.
//!
//! The exception classes are made here, once, with Python's
//! `type(name, bases, dict)` (several have two bases, which
//! `create_exception!` cannot give), and added to `hostpool._hostpool` at
//! module init; `hostpool/_errors.py` re-exports them, and Python code may
//! subclass them (`hostpool.torch` does).

use pool_core::{Error, Phase};
use pyo3::exceptions::{PyBufferError, PyKeyboardInterrupt, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// A `hostpool` exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Error(RuntimeError)`: the base of every hostpool error.
    Error,
    /// `ConfigError(Error, ValueError)`: bad input (exit status 2).
    Config,
    /// `CapacityError(Error)`: the node cannot hold the pool.
    Capacity,
    /// `PeerError(Error)`: a peer rank of a shared pool failed or vanished.
    Peer,
    /// `NotAvailableError(Error)`: something this host lacks.
    NotAvailable,
    /// `PinError(Error)`: required pinning failed.
    Pin,
    /// `PoolBusyError(Error, BufferError)`: `close()` while exports live.
    PoolBusy,
    /// `KeeperError(Error)`: the pool's keeper does not answer, refused the
    /// lease, or went away during it.
    Keeper,
}

impl Kind {
    /// Every class, each after its bases.
    const ALL: [Kind; 8] = [
        Kind::Error,
        Kind::Config,
        Kind::Capacity,
        Kind::Peer,
        Kind::NotAvailable,
        Kind::Pin,
        Kind::PoolBusy,
        Kind::Keeper,
    ];

    /// The class's name in `hostpool`.
    fn name(self) -> &'static str {
        match self {
            Kind::Error => "Error",
            Kind::Config => "ConfigError",
            Kind::Capacity => "CapacityError",
            Kind::Peer => "PeerError",
            Kind::NotAvailable => "NotAvailableError",
            Kind::Pin => "PinError",
            Kind::PoolBusy => "PoolBusyError",
            Kind::Keeper => "KeeperError",
        }
    }

    /// The class's docstring.
    fn doc(self) -> &'static str {
        match self {
            Kind::Error => {
                "Base of every hostpool error.\n\n\
                 ``exit_code`` is what the ``hostpool`` CLI exits with for the same failure:\n\
                 2 for bad input, 1 for a runtime failure, 128 + N for signal N.\n"
            }
            Kind::Config => {
                "The configuration is wrong (a bad size, key, plugin name or combination)."
            }
            Kind::Capacity => "The node cannot hold the pool; ``remedy`` says how to make room.",
            Kind::Peer => {
                "A peer rank of a shared pool failed, died, stopped or never attached.\n\n\
                 ``ranks`` are the ranks the message blames, in the order it names them\n\
                 (the rank that failed or died, every rank that never attached, or this\n\
                 rank when its own setup failed); ``rank`` is the first of them, or\n\
                 ``None`` when it names the peer only by pid, as a joiner does for a\n\
                 creator that never welcomed it. ``pid`` is the process id of the first\n\
                 peer blamed, or ``None`` when it is not known (a rank that never\n\
                 attached).\n"
            }
            Kind::NotAvailable => {
                "Something this host lacks: no GPU driver, no device, no huge pages of that size."
            }
            Kind::Pin => "Pinning the pool failed (and was required); nothing stays pinned.",
            Kind::PoolBusy => {
                "``close()`` while buffers, arrays or tensors exported from the pool are alive.\n\n\
                 The pool is left intact: delete the exports (``del tensor``), then close again.\n"
            }
            Kind::Keeper => {
                "The pool's keeper (``keeper=\"NAME\"``) does not answer, refused the lease, or\n\
                 went away during it. ``keeper`` is the kept pool's name, ``pid`` the process\n\
                 blamed (the keeper, or the lease's holder) when known, and ``absent`` whether\n\
                 no keeper answers at all (``keeper_fallback=\"build\"`` then builds instead).\n"
            }
        }
    }

    /// The class's bases: hostpool's `Error` for all but itself, and the
    /// built-in exception a caller may already catch.
    fn bases<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let error = || class(py, Kind::Error).map(|c| c.clone().into_any());
        let bases = match self {
            Kind::Error => vec![py.get_type::<PyRuntimeError>().into_any()],
            Kind::Config => vec![error()?, py.get_type::<PyValueError>().into_any()],
            Kind::PoolBusy => vec![error()?, py.get_type::<PyBufferError>().into_any()],
            Kind::Capacity | Kind::Peer | Kind::NotAvailable | Kind::Pin | Kind::Keeper => {
                vec![error()?]
            }
        };
        PyTuple::new(py, bases)
    }

    /// The class's namespace: docstring, module, and the defaults of the
    /// attributes [`to_py`] sets on an instance.
    fn namespace<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("__doc__", self.doc())?;
        d.set_item("__module__", "hostpool")?;
        match self {
            Kind::Error => d.set_item("exit_code", 1)?,
            Kind::Config => d.set_item("exit_code", 2)?,
            Kind::Capacity => {
                d.set_item("remedy", "")?;
                d.set_item("need", 0)?;
                d.set_item("free", 0)?;
            }
            Kind::Peer => {
                d.set_item("rank", py.None())?;
                d.set_item("ranks", PyTuple::empty(py))?;
                d.set_item("pid", py.None())?;
            }
            Kind::Keeper => {
                d.set_item("keeper", "")?;
                d.set_item("pid", py.None())?;
                d.set_item("absent", false)?;
            }
            Kind::NotAvailable | Kind::Pin | Kind::PoolBusy => {}
        }
        Ok(d)
    }
}

/// The classes, made once, in [`Kind::ALL`]'s order.
static CLASSES: [PyOnceLock<Py<PyType>>; Kind::ALL.len()] =
    [const { PyOnceLock::new() }; Kind::ALL.len()];

/// The `hostpool` exception class of `kind`, made on first use.
fn class(py: Python<'_>, kind: Kind) -> PyResult<&Bound<'_, PyType>> {
    CLASSES[kind as usize]
        .get_or_try_init(py, || {
            py.get_type::<PyType>()
                .call1((kind.name(), kind.bases(py)?, kind.namespace(py)?))?
                .cast_into::<PyType>()
                .map(Bound::unbind)
                .map_err(PyErr::from)
        })
        .map(|c| c.bind(py))
}

/// Add every exception class to the module (`hostpool._hostpool`).
///
/// # Errors
/// When Python cannot make a class or add it.
pub fn add_classes(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for kind in Kind::ALL {
        m.add(kind.name(), class(m.py(), kind)?)?;
    }
    Ok(())
}

/// The exception class for `e`, raised during `phase` (the build's last
/// started phase, when known).
fn kind_of(e: &Error, phase: Option<Phase>) -> Kind {
    match e {
        e if e.is_usage() => Kind::Config,
        Error::Capacity { .. } => Kind::Capacity,
        Error::Peer { .. } => Kind::Peer,
        Error::Keeper { .. } => Kind::Keeper,
        Error::NotAvailable { .. } => Kind::NotAvailable,
        _ if phase == Some(Phase::Pin) => Kind::Pin,
        _ => Kind::Error,
    }
}

/// A `hostpool` exception of `kind` with `message`; a `RuntimeError` when
/// the class cannot be made.
pub fn raise(py: Python<'_>, kind: Kind, message: String) -> PyErr {
    match new(py, kind, &message) {
        Ok(err) => PyErr::from_value(err),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

fn new<'py>(py: Python<'py>, kind: Kind, message: &str) -> PyResult<Bound<'py, PyAny>> {
    class(py, kind)?.call1((message,))
}

/// `e` as a Python exception.
pub fn to_py(py: Python<'_>, e: &Error, phase: Option<Phase>) -> PyErr {
    let text = e.chain_message();
    if let Error::Interrupted { signal } = e
        && *signal == libc::SIGINT
    {
        return PyKeyboardInterrupt::new_err(text);
    }
    let built = new(py, kind_of(e, phase), &text).and_then(|err| {
        err.setattr("exit_code", e.exit_code())?;
        match e {
            Error::Capacity {
                remedy, need, free, ..
            } => {
                err.setattr("remedy", remedy.as_str())?;
                err.setattr("need", *need)?;
                err.setattr("free", *free)?;
            }
            Error::Peer { ranks, pid, .. } => {
                err.setattr("rank", ranks.first().copied())?;
                err.setattr("ranks", PyTuple::new(py, ranks)?)?;
                err.setattr("pid", *pid)?;
            }
            Error::Keeper {
                name, pid, absent, ..
            } => {
                err.setattr("keeper", name.as_str())?;
                err.setattr("pid", *pid)?;
                err.setattr("absent", *absent)?;
            }
            _ => {}
        }
        Ok(err)
    });
    match built {
        Ok(err) => PyErr::from_value(err),
        Err(_) => PyRuntimeError::new_err(text),
    }
}
