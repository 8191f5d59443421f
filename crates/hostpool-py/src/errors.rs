//! Each [`pool_core::Error`] as the `hostpool` exception that names its
//! kind (classes in `hostpool/_errors.py`), with the CLI's message: the error
//! and its causes in one paragraph.

use pool_core::{Error, Phase};
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;

/// The exception class for `e`, raised during `phase` (the build's last
/// started phase, when known).
fn class_of(e: &Error, phase: Option<Phase>) -> &'static str {
    match e {
        e if e.is_usage() => "ConfigError",
        Error::Capacity { .. } => "CapacityError",
        Error::Peer { .. } => "PeerError",
        Error::NotAvailable { .. } => "NotAvailableError",
        _ if phase == Some(Phase::Pin) => "PinError",
        _ => "Error",
    }
}

/// A `hostpool.<class>` exception with `message`; a `RuntimeError` when
/// the package's exception module cannot be imported.
pub fn raise(py: Python<'_>, class: &str, message: String) -> PyErr {
    match new(py, class, &message) {
        Ok(err) => PyErr::from_value(err),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

fn new<'py>(py: Python<'py>, class: &str, message: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("hostpool._errors")?
        .getattr(class)?
        .call1((message,))
}

/// `e` as a Python exception.
pub fn to_py(py: Python<'_>, e: &Error, phase: Option<Phase>) -> PyErr {
    let text = e.chain_message();
    if let Error::Interrupted { signal } = e
        && *signal == libc::SIGINT
    {
        return PyKeyboardInterrupt::new_err(text);
    }
    let class = class_of(e, phase);
    let built = new(py, class, &text).and_then(|err| {
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
                err.setattr("ranks", pyo3::types::PyTuple::new(py, ranks)?)?;
                err.setattr("pid", *pid)?;
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
