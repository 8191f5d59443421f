//! The only `unsafe` of the binding: the buffer protocol and DLPack
//! capsules, both over memory an [`Exports`] counts.
//!
//! [`Exports`] is the base class of `Pool`: it holds the pool's address
//! range and counts what is exported from it. Soundness rests on one rule:
//! an export is counted (under the lock [`Exports::close`] takes) before its
//! pointer leaves this module, and `close` refuses while any is counted;
//! each export also holds a strong reference to the pool object, so the
//! pool cannot be collected under it either. This module names no other
//! module of the binding but `errors`.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_void};
use std::sync::Mutex;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::{self, Kind};

/// DLPack's `(kDLCPU, 0)`.
pub const DLPACK_CPU: (i32, i32) = (1, 0);

/// The counted exports of a pool's memory; `Pool`'s base class.
#[pyclass(module = "hostpool._hostpool", name = "_Exports", subclass, frozen)]
#[derive(Debug)]
pub struct Exports {
    state: Mutex<ExportState>,
}

#[derive(Debug)]
struct ExportState {
    /// The address and logical length; `None` once closed.
    memory: Option<(usize, usize)>,
    /// Buffers and DLPack tensors alive.
    count: usize,
}

impl Exports {
    /// The exports of `len` bytes at `addr`, none yet.
    pub fn new(addr: usize, len: usize) -> Exports {
        Exports {
            state: Mutex::new(ExportState {
                memory: Some((addr, len)),
                count: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ExportState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count one export of the whole pool: its address and logical length,
    /// valid until the matching [`Exports::release`].
    fn acquire(&self, py: Python<'_>) -> PyResult<(usize, usize)> {
        let mut state = self.lock();
        let Some(memory) = state.memory else {
            return Err(errors::raise(
                py,
                Kind::Error,
                "the pool is closed: it has no memory to export any more".into(),
            ));
        };
        state.count += 1;
        Ok(memory)
    }

    /// One export ended.
    fn release(&self) {
        let mut state = self.lock();
        state.count = state.count.saturating_sub(1);
    }

    /// `Ok` when no export is alive, else how many are (nothing changes).
    pub fn alive(&self) -> Result<(), usize> {
        match self.lock().count {
            0 => Ok(()),
            n => Err(n),
        }
    }

    /// Export nothing more: `Ok` when no export is alive (every later
    /// export is refused, and the memory may go), else the number alive,
    /// with nothing changed.
    pub fn close(&self) -> Result<(), usize> {
        let mut state = self.lock();
        if state.count > 0 {
            return Err(state.count);
        }
        state.memory = None;
        Ok(())
    }
}

#[pymethods]
impl Exports {
    /// The buffer protocol: the pool's `nbytes` bytes, writable, format `B`.
    ///
    /// # Safety
    /// Called by Python with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let py = slf.py();
        let (addr, len) = slf.get().acquire(py)?;
        let len = isize::try_from(len).unwrap_or(isize::MAX);
        // SAFETY: `view` is the caller's to fill; `addr..addr+len` stays
        // mapped until `__releasebuffer__` (the export is counted and
        // `close` refuses meanwhile); `PyBuffer_FillInfo` takes a new
        // reference to `slf` into `view->obj`, keeping the pool alive.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), addr as *mut c_void, len, 0, flags)
        };
        if rc != 0 {
            slf.get().release();
            return Err(PyErr::fetch(py));
        }
        Ok(())
    }

    /// The end of a buffer export.
    ///
    /// # Safety
    /// Called by Python once per successful `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.release();
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack < 1.0's `DLManagedTensor`.
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// DLPack 1.0's `DLManagedTensorVersioned`.
#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What a capsule's tensor owns: its shape, and one counted export of the
/// pool with a strong reference to it.
struct Owner {
    shape: [i64; 1],
    pool: Py<Exports>,
}

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

fn tensor(addr: usize, shape: *mut i64) -> DLTensor {
    DLTensor {
        data: addr as *mut c_void,
        device: DLDevice {
            device_type: DLPACK_CPU.0,
            device_id: DLPACK_CPU.1,
        },
        ndim: 1,
        dtype: DLDataType {
            code: 1, // kDLUInt
            bits: 8,
            lanes: 1,
        },
        shape,
        strides: std::ptr::null_mut(), // compact, row-major
        byte_offset: 0,
    }
}

/// Drop what a managed tensor owns: end its export, release the pool.
///
/// # Safety
/// `ctx` came from `Box::into_raw` of an [`Owner`] and is dropped once.
unsafe fn drop_owner(ctx: *mut c_void) {
    // SAFETY: as the caller promises.
    let owner = unsafe { Box::from_raw(ctx.cast::<Owner>()) };
    // The deleter may run on any thread, with or without the GIL.
    Python::attach(|_py| {
        owner.pool.get().release();
        drop(owner);
    });
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` came from `Box::into_raw` in `dlpack`; DLPack calls the
    // deleter once.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: `manager_ctx` is the tensor's `Owner`, dropped only here.
    unsafe { drop_owner(m.manager_ctx) };
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: as in `delete_legacy`.
    unsafe { drop_owner(m.manager_ctx) };
}

/// The capsule's destructor: a capsule never consumed (still named
/// `dltensor` / `dltensor_versioned`) deletes its tensor; a consumer renames
/// it `used_...` and calls the deleter itself when done.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule (Python calls this from its
    // dealloc); the name checks tell which struct it holds, if unconsumed.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            delete_versioned(m.cast());
        } else if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            delete_legacy(m.cast());
        }
        // Clear an error from a failed check: a destructor raises nothing.
        if !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
        }
    }
}

/// A DLPack capsule of the whole pool as a 1-D `uint8` CPU tensor
/// (versioned, DLPack 1.0, when the consumer asked for it).
pub fn dlpack<'py>(pool: &Bound<'py, Exports>, versioned: bool) -> PyResult<Bound<'py, PyAny>> {
    let py = pool.py();
    let (addr, len) = pool.get().acquire(py)?;
    let owner = Box::into_raw(Box::new(Owner {
        shape: [i64::try_from(len).unwrap_or(i64::MAX)],
        pool: pool.clone().unbind(),
    }));
    // SAFETY: `owner` is a live box until `drop_owner`; its shape outlives
    // the tensor, which is deleted no later than the owner.
    let shape = unsafe { (&raw mut (*owner).shape).cast::<i64>() };
    let (ptr, name): (*mut c_void, &CStr) = if versioned {
        let m = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: owner.cast(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor: tensor(addr, shape),
        });
        (Box::into_raw(m).cast(), VERSIONED)
    } else {
        let m = Box::new(DLManagedTensor {
            dl_tensor: tensor(addr, shape),
            manager_ctx: owner.cast(),
            deleter: Some(delete_legacy),
        });
        (Box::into_raw(m).cast(), LEGACY)
    };
    // SAFETY: `ptr` is the managed tensor for `name`; the destructor frees
    // it unless a consumer took it.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        let err = PyErr::fetch(py);
        // SAFETY: the capsule was not made: nobody else holds `ptr`.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
        }
        return Err(err);
    }
    // SAFETY: `capsule` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}
