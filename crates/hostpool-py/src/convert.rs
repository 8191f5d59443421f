//! Values handed to Python: sizes read from Python, reports and plans as
//! dicts (through JSON, as the CLI prints them).

use pool_core::{Error, PoolReport};
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

pub fn json_dict<'py, T: serde::Serialize>(
    py: Python<'py>,
    value: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| {
        errors::raise(
            py,
            errors::Kind::Error,
            format!("could not be written as JSON: {e}"),
        )
    })?;
    py.import("json")?.call_method1("loads", (text,))
}

pub fn report_dict<'py>(py: Python<'py>, report: &PoolReport) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(report).map_err(|e| {
        errors::raise(
            py,
            errors::Kind::Error,
            format!("the report could not be written as JSON: {e}"),
        )
    })?;
    py.import("json")?.call_method1("loads", (text,))
}
