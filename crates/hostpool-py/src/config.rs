//! `Pool(...)`'s keyword arguments, and `Pool.from_config(...)`, into a
//! [`PoolConfig`]: the same keys, parsers and checks as the CLI's flags and
//! config files.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use pool_core::host::memlock::MemlockPolicy;
use pool_core::{ByteSize, Choice, Error, PinScope, PoolConfig, PrefaultChoice, SharingConfig};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

/// A size: an `int` of bytes or an IEC string (`"64GiB"`), read with the
/// CLI's parser; `key` names it in the error.
pub fn size(key: &str, value: &Bound<'_, PyAny>) -> Result<ByteSize, Error> {
    if value.is_instance_of::<PyBool>() {
        return Err(Error::config(format!(
            "`{key}` must be a number of bytes or a size such as \"64GiB\", not a bool"
        )));
    }
    if value.is_instance_of::<PyInt>() {
        return match value.extract::<u64>() {
            Ok(bytes) => Ok(ByteSize(bytes)),
            Err(_) => Err(Error::config(format!(
                "`{key}` = {value} is not a size in bytes: give a positive number below 2**64"
            ))),
        };
    }
    if let Ok(text) = value.cast::<PyString>() {
        let text = text.to_string();
        return text.parse::<ByteSize>().map_err(|e| Error::Size {
            key: key.to_string(),
            source: Box::new(e),
        });
    }
    Err(Error::config(format!(
        "`{key}` must be an int of bytes or a size string such as \"64GiB\", not {}",
        type_name(value)
    )))
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "this type".into())
}

/// A path: `str` or `os.PathLike`.
pub fn path(key: &str, value: &Bound<'_, PyAny>) -> Result<PathBuf, Error> {
    let py = value.py();
    let fspath = py
        .import("os")
        .and_then(|os| os.call_method1("fspath", (value,)))
        .and_then(|p| p.extract::<PathBuf>());
    fspath.map_err(|_| {
        Error::config(format!(
            "`{key}` must be a path (str or os.PathLike), not {}",
            type_name(value)
        ))
    })
}

/// A keyword argument that names one of pool-core's choices (`prefault`,
/// `pin_scope`, `memlock_bound`, `rendezvous`): a `str`, read with the same
/// `FromStr` as config files and flags (`_` taken as `-`). A wrong name or
/// type is a `ConfigError` that lists the values there are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Parsed<T>(pub T);

impl<'a, 'py, T: Choice> FromPyObject<'a, 'py> for Parsed<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        let parsed = match obj.cast::<PyString>() {
            Ok(text) => T::parse(&text.to_string()).map_err(|e| Error::config(e.to_string())),
            Err(_) => Err(Error::config(format!(
                "a {} must be a str such as \"{}\", not {}",
                T::WHAT,
                T::ALL[0].1,
                type_name(&obj)
            ))),
        };
        parsed
            .map(Parsed)
            .map_err(|e| crate::errors::to_py(py, &e, None))
    }
}

/// The prefault thread count.
pub fn threads(value: i64) -> Result<NonZeroUsize, Error> {
    usize::try_from(value)
        .ok()
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| {
            Error::config(format!(
                "threads = {value}: give 1 or more prefault threads"
            ))
        })
}

/// `numa_node=`: a node number, `"gpu"` (the node of the pool's GPU), or
/// for a shared pool one node per rank (a list, or `"0,0,1,1"`).
pub fn numa_node(value: &Bound<'_, PyAny>) -> Result<pool_core::NumaNode, Error> {
    let bad = || {
        Error::config(format!(
            "numa_node={}: give a node number (0), \"gpu\" (the node of the pool's GPU) or, for \
             a shared pool, a list of one node per rank ([0, 0, 1, 1])",
            value
                .repr()
                .map_or_else(|_| "?".to_string(), |r| r.to_string())
        ))
    };
    let node = |v: &Bound<'_, PyAny>| -> Result<u32, Error> {
        if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
            return Err(bad());
        }
        v.extract::<u32>().map_err(|_| bad())
    };
    if value.is_instance_of::<PyString>() {
        let text: String = value.extract().map_err(|_| bad())?;
        return pool_core::NumaNode::parse(&text);
    }
    if value.is_instance_of::<PyInt>() || value.is_instance_of::<PyBool>() {
        return node(value).map(pool_core::NumaNode::Node);
    }
    if value.is_instance_of::<pyo3::types::PyList>()
        || value.is_instance_of::<pyo3::types::PyTuple>()
    {
        return value
            .try_iter()
            .map_err(|_| bad())?
            .map(|v| v.map_err(|_| bad()).and_then(|v| node(&v)))
            .collect::<Result<Vec<_>, _>>()
            .map(pool_core::NumaNode::PerRank);
    }
    Err(bad())
}

/// The keyword arguments of `Pool(...)`, other than `progress`.
#[derive(Debug)]
pub struct Args {
    pub size: ByteSize,
    pub size_given: bool,
    pub huge_pages: Option<pool_core::HugePages>,
    pub keeper: Option<String>,
    pub keeper_tag: Option<String>,
    pub keeper_fallback: pool_core::KeeperFallback,
    pub keeper_attach_timeout: Option<f64>,
    pub backing: String,
    pub dir: Option<PathBuf>,
    pub page_size: Option<ByteSize>,
    pub numa_node: Option<pool_core::NumaNode>,
    pub threads: Option<NonZeroUsize>,
    pub prefault: PrefaultChoice,
    pub block_size: Option<ByteSize>,
    pub sharing: Option<SharingConfig>,
    pub pin: Option<String>,
    pub pin_required: bool,
    pub pin_scope: PinScope,
    pub pin_background: bool,
    pub background_chunk: Option<ByteSize>,
    pub memlock_bound: MemlockPolicy,
    pub register: Vec<String>,
}

impl Args {
    /// The config these arguments describe. The keeper's keywords fill the
    /// `[lease]` table, which the plan checks as it checks a config file's
    /// (the one check of a lease: none here).
    pub fn into_config(self) -> Result<PoolConfig, Error> {
        let leased = self.keeper.is_some()
            || self.keeper_tag.is_some()
            || self.keeper_fallback != pool_core::KeeperFallback::Fail
            || self.keeper_attach_timeout.is_some();
        let lease = leased.then(|| pool_core::LeaseConfig {
            keeper: self.keeper,
            tag: self.keeper_tag,
            fallback: self.keeper_fallback,
            attach_timeout_secs: self.keeper_attach_timeout,
            companion_of: None,
            size: self.size_given.then_some(self.size),
        });
        let mut config = PoolConfig {
            size: self.size,
            backing: self.backing,
            dir: self.dir,
            page_size: self.page_size,
            threads: self.threads,
            prefault: self.prefault,
            block_size: self.block_size,
            register: self.register,
            sharing: self.sharing,
            numa_node: self.numa_node,
            lease,
            huge_pages: self.huge_pages,
            ..PoolConfig::default()
        };
        config.pin.kind = self.pin.and_then(pool_core::pin_kind_from);
        if self.pin_required && !config.pin.is_on() {
            return Err(Error::config(
                "pin_required=True needs a pinner: pass pin=\"cuda\" or pin=\"mlock\"",
            ));
        }
        config.pin.required = self.pin_required;
        config.pin.scope = self.pin_scope;
        config.pin.background = self.pin_background;
        config.pin.background_chunk = self.background_chunk;
        config.pin.memlock_bound = self.memlock_bound;
        Ok(config)
    }
}

/// `register`: a sequence of registrar names (one name alone is taken as a
/// one-item list).
pub fn register(value: &Bound<'_, PyAny>) -> Result<Vec<String>, Error> {
    if let Ok(one) = value.extract::<String>() {
        return Ok(vec![one]);
    }
    value.extract::<Vec<String>>().map_err(|_| {
        Error::config(format!(
            "`register` must be a sequence of registrar names such as (\"rdma\",), not {}",
            type_name(value)
        ))
    })
}

/// `Pool.from_config(source)`: a path to a TOML or JSON file, or a dict of
/// the config file's keys (vLLM's `host_pool_gib`/`host_pool_dir` included).
pub fn from_source(source: &Bound<'_, PyAny>) -> Result<PoolConfig, Error> {
    let py = source.py();
    if source.is_instance_of::<pyo3::types::PyDict>() {
        let text: String = py
            .import("json")
            .and_then(|json| json.call_method1("dumps", (source,)))
            .and_then(|t| t.extract())
            .map_err(|e| {
                Error::config(format!(
                    "the config dict cannot be read as JSON ({e}): give strings, numbers, bools, \
                     lists and dicts only"
                ))
            })?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::config(format!("the config dict: {e}")))?;
        return PoolConfig::from_value(value);
    }
    let path = path("config", source).map_err(|_| {
        Error::config(format!(
            "from_config takes a path to a TOML or JSON file, or a dict of its keys, not {}",
            type_name(source)
        ))
    })?;
    PoolConfig::from_path(&path)
}
