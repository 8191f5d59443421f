//! `Pool.index(...)`: the crash-consistent index of what a kept pool holds
//! (`hostpool-index`), in a page-aligned region of the pool itself, for an
//! engine's offloading manager: record a slot's key once its bytes are
//! written, unrecord it before they are overwritten, read every record back
//! after a restart, find a key's slot without reading them. Each call is a
//! few atomic loads and stores into the pool, under the pool's lock (so a
//! `close()` cannot unmap it meanwhile): no system call per block.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use hostpool_index::{Cold, Fingerprint, Index, Start};
use pool_core::Extent;

use crate::errors;

/// How an index reaches its pool's memory: runs the closure on the pool's
/// region under the pool's lock, or raises when the pool is closed. The
/// pool gives it (`Pool.index`), so this module names no pool.
pub type Reach =
    fn(&Bound<'_, PyAny>, &mut dyn FnMut(pool_core::Region<'_>) -> PyResult<()>) -> PyResult<()>;

/// Why an index started cold, as its attach said (here, or in the keeper
/// that attached it for `Pool.tier_open`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdStart {
    /// The sentence for the log ([`Cold`]'s `Display`).
    pub reason: String,
    /// The fingerprint field that differed, with its stored and its new
    /// value, when that was why.
    pub field: Option<(String, Option<String>, Option<String>)>,
}

impl From<Cold> for ColdStart {
    fn from(why: Cold) -> ColdStart {
        ColdStart {
            reason: why.to_string(),
            field: match why {
                Cold::Differs(d) => Some((d.field, d.stored, d.now)),
                _ => None,
            },
        }
    }
}

/// The index of a pool's slots (see `Pool.index` and `Pool.tier_open`).
#[pyclass(module = "hostpool._hostpool", name = "KvIndex", frozen)]
#[derive(Debug)]
pub struct PyKvIndex {
    pool: Py<PyAny>,
    reach: Reach,
    extent: Extent,
    capacity: u64,
    cold: Option<ColdStart>,
    digest: String,
    fields: Vec<(String, String)>,
    /// The keeper's CPU tier (`Pool.tier_open`): the keeper is its one
    /// writer, so this process only reads it.
    tier: bool,
}

/// The bytes an index of `slots` records takes in a pool of `page`-byte
/// pages: a whole number of pages.
pub fn index_bytes(slots: u64, page: u64) -> PyResult<u64> {
    hostpool_index::bytes_for(slots)
        .and_then(|b| b.checked_next_multiple_of(page.max(1)))
        .ok_or_else(|| PyValueError::new_err(format!("an index of {slots} slots is too large")))
}

fn index_error(py: Python<'_>, e: &hostpool_index::Error) -> PyErr {
    match e {
        hostpool_index::Error::NoSlot { .. } | hostpool_index::Error::KeyTooLong { .. } => {
            PyValueError::new_err(e.to_string())
        }
        _ => errors::raise(py, errors::Kind::Config, e.to_string()),
    }
}

impl PyKvIndex {
    /// Attach to the index at `offset` of `pool` (of `mapped` bytes in
    /// `page`-byte pages) for `slots` and `fingerprint`.
    pub fn attach(
        (pool, reach): (&Bound<'_, PyAny>, Reach),
        (slots, offset): (u64, u64),
        fingerprint: Vec<(String, String)>,
        (mapped, page): (u64, u64),
    ) -> PyResult<PyKvIndex> {
        let py = pool.py();
        let fp = Fingerprint::new(fingerprint.clone())
            .map_err(|e| errors::raise(py, errors::Kind::Config, e.to_string()))?;
        let len = index_bytes(slots, page)?;
        let extent = Extent { offset, len };
        let start = run(pool, reach, |region| {
            let words = region.words(extent).map_err(|_| {
                errors::raise(
                    py,
                    errors::Kind::Config,
                    format!(
                        "an index of {slots} slots takes {len} bytes at a page-aligned offset \
                         inside the pool: offset {offset} of a pool of {} bytes ({}-byte pages) \
                         is not; give the pool {len} bytes more, at its end",
                        mapped, page
                    ),
                )
            })?;
            // At the pool's tail, an index made there for another number of
            // slots is found too, so that a cold start names what changed.
            let attached = if offset + len == mapped {
                let pool = region
                    .words(Extent {
                        offset: 0,
                        len: mapped,
                    })
                    .map_err(|e| {
                        errors::raise(py, errors::Kind::Error, format!("the pool's words: {e}"))
                    })?;
                Index::attach_tail(pool, slots, page, &fp)
            } else {
                Index::attach(words, slots, &fp)
            };
            attached
                .map(|(_, start)| start)
                .map_err(|e| index_error(py, &e))
        })?;
        let cold = match start {
            Start::Warm => None,
            Start::Cold(why) => Some(why.into()),
        };
        Ok(PyKvIndex {
            pool: pool.clone().unbind(),
            reach,
            extent,
            capacity: slots,
            cold,
            digest: fp.digest(),
            fields: fingerprint,
            tier: false,
        })
    }

    /// The index of `slots` slots the keeper attached at the tail of
    /// `pool` (of `mapped` bytes in `page`-byte pages) for `fingerprint`
    /// (`Pool.tier_open`), read in place: nothing is written here (the
    /// keeper is its one writer; an attach here could format it afresh
    /// under the other tenants). `cold` is what the keeper's attach found.
    ///
    /// # Errors
    /// `ConfigError` for a fingerprint an index cannot take or a pool too
    /// small; `hostpool.Error` when the pool's tail holds no index of
    /// `slots` slots (an engine formatted it since, for another number).
    pub fn opened(
        (pool, reach): (&Bound<'_, PyAny>, Reach),
        slots: u64,
        fingerprint: Vec<(String, String)>,
        (mapped, page): (u64, u64),
        cold: Option<ColdStart>,
    ) -> PyResult<PyKvIndex> {
        let py = pool.py();
        let fp = Fingerprint::new(fingerprint.clone())
            .map_err(|e| errors::raise(py, errors::Kind::Config, e.to_string()))?;
        let len = index_bytes(slots, page)?;
        let offset = mapped.checked_sub(len).ok_or_else(|| {
            errors::raise(
                py,
                errors::Kind::Config,
                format!(
                    "an index of {slots} slots takes {len} bytes, more than the pool's {mapped}"
                ),
            )
        })?;
        let index = PyKvIndex {
            pool: pool.clone().unbind(),
            reach,
            extent: Extent { offset, len },
            capacity: slots,
            cold,
            digest: fp.digest(),
            fields: fingerprint,
            tier: true,
        };
        // Read only: the header the keeper wrote, checked as every call does.
        index.with(py, |_| Ok(()))?;
        Ok(index)
    }

    /// Refuse a write to the keeper's tier (`what`: the method).
    fn writable(&self, py: Python<'_>, what: &str) -> PyResult<()> {
        if !self.tier {
            return Ok(());
        }
        Err(errors::raise(
            py,
            errors::Kind::Config,
            format!(
                "KvIndex.{what}: this index is the keeper's CPU tier (`Pool.tier_open`), which the \
                 keeper alone writes; store through `Pool.tier_store` and `Pool.tier_stored`, \
                 note uses with `Pool.tier_touch`, and read it here (`find`, `get`, `len`)"
            ),
        ))
    }

    /// Run `f` on the index, under the pool's lock.
    fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Index<'_>) -> Result<T, hostpool_index::Error>,
    ) -> PyResult<T> {
        run(self.pool.bind(py), self.reach, |region| {
            let index = region
                .words(self.extent)
                .ok()
                .and_then(|w| Index::resume(w, self.capacity))
                .ok_or_else(|| {
                    errors::raise(
                        py,
                        errors::Kind::Error,
                        "the pool's index was overwritten (another attach formatted it for \
                         another number of slots, or the pool was cleared)"
                            .into(),
                    )
                })?;
            f(&index).map_err(|e| index_error(py, &e))
        })
    }
}

/// `f` on the pool's region, through `reach`.
fn run<T>(
    pool: &Bound<'_, PyAny>,
    reach: Reach,
    f: impl FnOnce(pool_core::Region<'_>) -> PyResult<T>,
) -> PyResult<T> {
    let mut f = Some(f);
    let mut out = None;
    reach(pool, &mut |region| {
        if let Some(f) = f.take() {
            out = Some(f(region)?);
        }
        Ok(())
    })?;
    out.ok_or_else(|| PyValueError::new_err("the pool's memory was not reached"))
}

#[pymethods]
impl PyKvIndex {
    /// Whether the index came back warm (the same identity, its records
    /// kept).
    #[getter]
    fn warm(&self) -> bool {
        self.cold.is_none()
    }

    /// Why it started cold (`None` when warm): a sentence for the log.
    #[getter]
    fn cold_reason(&self) -> Option<String> {
        self.cold.as_ref().map(|c| c.reason.clone())
    }

    /// The fingerprint field that differed, with the stored and the new
    /// value, when that is why it started cold.
    #[getter]
    fn cold_field(&self) -> Option<(String, Option<String>, Option<String>)> {
        self.cold.as_ref().and_then(|c| c.field.clone())
    }

    /// How many records the index holds now (those a warm attach found,
    /// until the engine records or unrecords): counted when asked, so the
    /// attach itself reads only the header.
    #[getter]
    fn restored(&self, py: Python<'_>) -> PyResult<usize> {
        self.__len__(py)
    }

    /// The slots it indexes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Where it is in the pool: `(offset, nbytes)`.
    #[getter]
    fn extent(&self) -> (u64, u64) {
        (self.extent.offset, self.extent.len)
    }

    /// The fingerprint's digest (32 hex digits).
    #[getter]
    fn digest(&self) -> &str {
        &self.digest
    }

    /// The fingerprint, as given.
    #[getter]
    fn fingerprint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.fields {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Record that `slot` holds the bytes of `key`, written completely.
    /// Returns its stamp.
    fn record(&self, py: Python<'_>, slot: u64, key: &[u8]) -> PyResult<u64> {
        self.writable(py, "record")?;
        self.with(py, |i| i.record(slot, key))
    }

    /// Record many: `slots[i]` holds `keys[i]`.
    fn record_many(&self, py: Python<'_>, slots: Vec<u64>, keys: Vec<Vec<u8>>) -> PyResult<()> {
        self.writable(py, "record_many")?;
        if slots.len() != keys.len() {
            return Err(PyValueError::new_err(format!(
                "record_many: {} slots for {} keys",
                slots.len(),
                keys.len()
            )));
        }
        self.with(py, |i| {
            slots
                .iter()
                .zip(&keys)
                .try_for_each(|(s, k)| i.record(*s, k).map(|_| ()))
        })
    }

    /// Unrecord `slot` (before its bytes are overwritten, or when evicted).
    fn unrecord(&self, py: Python<'_>, slot: u64) -> PyResult<()> {
        self.writable(py, "unrecord")?;
        self.with(py, |i| i.unrecord(slot))
    }

    /// Unrecord many slots.
    fn unrecord_many(&self, py: Python<'_>, slots: Vec<u64>) -> PyResult<()> {
        self.writable(py, "unrecord_many")?;
        self.with(py, |i| slots.iter().try_for_each(|s| i.unrecord(*s)))
    }

    /// Note a use of `slot`'s key (it becomes the most recent).
    fn touch(&self, py: Python<'_>, slot: u64) -> PyResult<()> {
        self.writable(py, "touch")?;
        self.with(py, |i| i.touch(slot))
    }

    /// Note a use of each slot's key, in order (the last becomes the most
    /// recent).
    fn touch_many(&self, py: Python<'_>, slots: Vec<u64>) -> PyResult<()> {
        self.writable(py, "touch_many")?;
        self.with(py, |i| slots.iter().try_for_each(|s| i.touch(*s)))
    }

    /// The slot recorded for `key`, or `None`: a few loads of the index's
    /// key table, whatever it holds (a record is read only for a bucket of
    /// its tag).
    fn find(&self, py: Python<'_>, key: &[u8]) -> PyResult<Option<u64>> {
        self.with(py, |i| Ok(i.find(key)))
    }

    /// `find` of each key, under one take of the pool's lock.
    fn find_many(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<Vec<Option<u64>>> {
        self.with(py, |i| {
            Ok(keys.iter().map(|k| i.find(k.as_bytes())).collect())
        })
    }

    /// Every slot once over: `(free, recorded)`, the free slots ascending
    /// and the recorded ones oldest use first (what to evict first).
    fn survey(&self, py: Python<'_>) -> PyResult<(Vec<u64>, Vec<u64>)> {
        let survey = self.with(py, |i| Ok(i.survey()))?;
        Ok((survey.free, survey.recorded))
    }

    /// The key `slot` holds, or `None`.
    fn get<'py>(&self, py: Python<'py>, slot: u64) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let entry = self.with(py, |i| i.get(slot))?;
        Ok(entry.map(|e| PyBytes::new(py, &e.key)))
    }

    /// Every record, oldest use first: a list of `(slot, key)`.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let entries = self.with(py, |i| Ok(i.entries()))?;
        let list = PyList::empty(py);
        for e in entries {
            list.append(PyTuple::new(
                py,
                [
                    e.slot.into_pyobject(py)?.into_any(),
                    PyBytes::new(py, &e.key).into_any(),
                ],
            )?)?;
        }
        Ok(list)
    }

    /// Unrecord every slot.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        self.writable(py, "clear")?;
        self.with(py, |i| {
            i.clear();
            Ok(())
        })
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |i| Ok(i.len()))
    }

    fn __repr__(&self) -> String {
        format!(
            "KvIndex(capacity={}, {}, digest={})",
            self.capacity,
            match &self.cold {
                None => "warm".to_string(),
                Some(why) => format!("cold: {}", why.reason),
            },
            self.digest
        )
    }
}
