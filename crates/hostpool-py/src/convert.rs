//! Values handed to Python: sizes read from Python, reports and plans as
//! dicts (through JSON, as the CLI prints them).

use pool_core::Error;
use pyo3::prelude::*;

use crate::{config, errors};

pub fn opt_size(
    key: &str,
    v: Option<&Bound<'_, PyAny>>,
) -> Result<Option<pool_core::ByteSize>, Error> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => config::size(key, v).map(Some),
    }
}

/// `value` as Python objects (through JSON, as the CLI prints it); `what`
/// names it in the error.
pub fn json_dict<'py, T: serde::Serialize>(
    py: Python<'py>,
    what: &str,
    value: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| {
        errors::raise(
            py,
            errors::Kind::Error,
            format!("{what} could not be written as JSON: {e}"),
        )
    })?;
    py.import("json")?.call_method1("loads", (text,))
}
