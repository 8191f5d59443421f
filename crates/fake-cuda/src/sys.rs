//! The exported driver symbols, with the C prototypes of `cuda.h` (CUDA 12.8).
//!
//! Each function checks its pointers, hands the work to the safe emulation in
//! the crate root, logs one line and returns a `CUresult`. None of them
//! unwinds: the emulation does not panic, and a panic would abort at the C
//! boundary rather than unwind into the caller.
//!
//! Exported: `cuInit`, `cuDriverGetVersion`, `cuDeviceGetCount`,
//! `cuDeviceGet`, `cuDeviceGetName`, `cuDeviceGetPCIBusId`, `cuDevicePrimaryCtxRetain`,
//! `cuDevicePrimaryCtxRelease_v2`, `cuCtxGetCurrent`, `cuCtxSetCurrent`, `cuCtxSynchronize`,
//! `cuMemHostRegister_v2`, `cuMemHostUnregister`, `cuMemAlloc_v2`,
//! `cuMemFree_v2`, `cuMemcpyHtoD_v2`, `cuMemcpyDtoH_v2`, `cuGetErrorName`,
//! `cuGetErrorString`.

#![allow(unsafe_code)]
#![allow(non_snake_case)] // the driver's own symbol names

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::{code, log};

/// `CUresult`, as the C ABI passes it.
pub type CUresult = c_uint;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUcontext` (an opaque pointer).
pub type CUcontext = *mut c_void;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;

fn done(call: String, result: u32) -> CUresult {
    log(&call, result);
    result
}

/// Store `value` in `*out` when `out` is not null; `INVALID_VALUE` otherwise.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> u32 {
    if out.is_null() {
        return code::INVALID_VALUE;
    }
    // SAFETY: not null, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    code::SUCCESS
}

/// `cuInit(unsigned int Flags)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    done(format!("cuInit {flags}"), crate::init())
}

/// `cuDriverGetVersion(int *driverVersion)`.
///
/// # Safety
/// `version` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: forwarded from this function's contract.
    let r = unsafe { put(version, crate::DRIVER_VERSION) };
    done("cuDriverGetVersion".into(), r)
}

/// `cuDeviceGetCount(int *count)`.
///
/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    let r = match crate::device_count() {
        // SAFETY: forwarded from this function's contract.
        Ok(n) => unsafe { put(count, n) },
        Err(e) => e,
    };
    done("cuDeviceGetCount".into(), r)
}

/// `cuDeviceGet(CUdevice *device, int ordinal)`.
///
/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    let r = match crate::device_get(ordinal) {
        // SAFETY: forwarded from this function's contract.
        Ok(d) => unsafe { put(device, d) },
        Err(e) => e,
    };
    done(format!("cuDeviceGet {ordinal}"), r)
}

/// `cuDeviceGetName(char *name, int len, CUdevice dev)`: a NUL-terminated
/// name, truncated to `len - 1` bytes.
///
/// # Safety
/// `name` is null or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    let r = match crate::device_name(dev) {
        Ok(text) => match usize::try_from(len) {
            Ok(cap) if cap > 0 && !name.is_null() => {
                let n = text.len().min(cap - 1);
                // SAFETY: `name` is valid for `len` bytes (contract), and we
                // write `n + 1 <= len` bytes; the source is a live String.
                unsafe {
                    std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
                    name.add(n).write(0);
                }
                code::SUCCESS
            }
            _ => code::INVALID_VALUE,
        },
        Err(e) => e,
    };
    done(format!("cuDeviceGetName {len} {dev}"), r)
}

/// `cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)`: the
/// device's PCI address, NUL-terminated (`0000:18:00.0`, or its entry in
/// `FAKE_CUDA_PCI_BUS_IDS`). As the driver: `CUDA_ERROR_NOT_INITIALIZED`
/// before `cuInit`, `CUDA_ERROR_INVALID_DEVICE` for a bad device, and
/// `CUDA_ERROR_INVALID_VALUE` for a null buffer or one too short for the id
/// and its NUL (nothing is written then: an id is never truncated).
///
/// # Safety
/// `pci_bus_id` is null or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    pci_bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    let r = match crate::pci_bus_id(dev) {
        Ok(id) => match usize::try_from(len) {
            Ok(cap) if cap > id.len() && !pci_bus_id.is_null() => {
                // SAFETY: `pci_bus_id` is valid for `len` bytes (contract),
                // and we write `id.len() + 1 <= len` bytes; the source is a
                // live String.
                unsafe {
                    std::ptr::copy_nonoverlapping(id.as_ptr(), pci_bus_id.cast::<u8>(), id.len());
                    pci_bus_id.add(id.len()).write(0);
                }
                code::SUCCESS
            }
            _ => code::INVALID_VALUE,
        },
        Err(e) => e,
    };
    done(format!("cuDeviceGetPCIBusId {len} {dev}"), r)
}

/// `cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
///
/// # Safety
/// `ctx` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let r = if ctx.is_null() {
        code::INVALID_VALUE
    } else {
        match crate::primary_retain(dev) {
            // SAFETY: not null, valid for a write by this function's
            // contract. The handle is an integer the caller never follows.
            Ok(handle) => unsafe { put(ctx, std::ptr::without_provenance_mut(handle)) },
            Err(e) => e,
        }
    };
    done(format!("cuDevicePrimaryCtxRetain {dev}"), r)
}

/// `cuDevicePrimaryCtxRelease_v2(CUdevice dev)`. The log line counts the
/// registrations still live in the context.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let (r, live) = crate::primary_release(dev);
    done(
        format!("cuDevicePrimaryCtxRelease_v2 {dev} live_registrations={live}"),
        r,
    )
}

/// `cuCtxGetCurrent(CUcontext *pctx)`: this thread's context, or null.
///
/// # Safety
/// `ctx` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult {
    let r = match crate::ctx_get_current() {
        // SAFETY: forwarded from this function's contract. The handle is an
        // integer the caller never follows.
        Ok(handle) => unsafe { put(ctx, std::ptr::without_provenance_mut(handle)) },
        Err(e) => e,
    };
    done("cuCtxGetCurrent".into(), r)
}

/// `cuCtxSetCurrent(CUcontext ctx)`: for this thread.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    let handle = ctx.addr();
    done(
        format!("cuCtxSetCurrent {handle:#x}"),
        crate::ctx_set_current(handle),
    )
}

/// `cuCtxSynchronize(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    done("cuCtxSynchronize".into(), crate::ctx_synchronize())
}

/// `cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)`.
/// The memory is not touched.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    let addr = p.addr();
    done(
        format!("cuMemHostRegister_v2 {addr:#x} {bytesize} {flags}"),
        crate::host_register(addr, bytesize, flags),
    )
}

/// `cuMemHostUnregister(void *p)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    let addr = p.addr();
    done(
        format!("cuMemHostUnregister {addr:#x}"),
        crate::host_unregister(addr),
    )
}

/// `cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`: host memory.
///
/// # Safety
/// `dptr` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let r = if dptr.is_null() {
        code::INVALID_VALUE
    } else {
        match crate::mem_alloc(bytesize) {
            // SAFETY: forwarded from this function's contract.
            Ok(addr) => unsafe { put(dptr, addr) },
            Err(e) => e,
        }
    };
    done(format!("cuMemAlloc_v2 {bytesize}"), r)
}

/// `cuMemFree_v2(CUdeviceptr dptr)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    done(format!("cuMemFree_v2 {dptr:#x}"), crate::mem_free(dptr))
}

/// `cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)`.
///
/// # Safety
/// `src` is valid for reads of `n` bytes that nothing writes during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    let registered = crate::is_registered(src.addr(), n);
    let r = if src.is_null() {
        code::INVALID_VALUE
    } else {
        crate::with_device_range(dst, n, |device| {
            // SAFETY: `src` is valid for `n` bytes (contract); `device` is a
            // distinct `n`-byte buffer owned by the emulation.
            unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), device.as_mut_ptr(), n) };
        })
        .map_or_else(|e| e, |()| code::SUCCESS)
    };
    done(
        format!(
            "cuMemcpyHtoD_v2 {dst:#x} {:#x} {n} registered={}",
            src.addr(),
            u8::from(registered)
        ),
        r,
    )
}

/// `cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)`. With
/// `FAKE_CUDA_CORRUPT_COPY=1` the middle byte copied is flipped.
///
/// # Safety
/// `dst` is valid for writes of `n` bytes that nothing else accesses during
/// the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    let registered = crate::is_registered(dst.addr(), n);
    let r = if dst.is_null() {
        code::INVALID_VALUE
    } else {
        crate::with_device_range(src, n, |device| {
            // SAFETY: `dst` is valid for `n` bytes (contract); `device` is a
            // distinct `n`-byte buffer owned by the emulation.
            unsafe { std::ptr::copy_nonoverlapping(device.as_ptr(), dst.cast::<u8>(), n) };
            if crate::corrupt_copies() && n > 0 {
                // SAFETY: `n / 2 < n`, inside the range just written.
                unsafe {
                    let b = dst.cast::<u8>().add(n / 2);
                    b.write(!b.read());
                }
            }
        })
        .map_or_else(|e| e, |()| code::SUCCESS)
    };
    done(
        format!(
            "cuMemcpyDtoH_v2 {:#x} {src:#x} {n} registered={}",
            dst.addr(),
            u8::from(registered)
        ),
        r,
    )
}

/// `cuGetErrorName(CUresult error, const char **pStr)`: a static string, or
/// `CUDA_ERROR_INVALID_VALUE` and `NULL` for a code the fake does not know.
///
/// # Safety
/// `p_str` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    let r = match crate::error_name(error) {
        // SAFETY: forwarded from this function's contract; the string is static.
        Some(s) => unsafe { put(p_str, s.as_ptr()) },
        None => {
            // SAFETY: as above.
            unsafe { put(p_str, std::ptr::null()) };
            code::INVALID_VALUE
        }
    };
    done(format!("cuGetErrorName {error}"), r)
}

/// `cuGetErrorString(CUresult error, const char **pStr)`.
///
/// # Safety
/// `p_str` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    let r = match crate::error_string(error) {
        // SAFETY: forwarded from this function's contract; the string is static.
        Some(s) => unsafe { put(p_str, s.as_ptr()) },
        None => {
            // SAFETY: as above.
            unsafe { put(p_str, std::ptr::null()) };
            code::INVALID_VALUE
        }
    };
    done(format!("cuGetErrorString {error}"), r)
}

/// Checks of the exported calls through their C signatures, run by the
/// crate's one test of the process-wide state (`cuInit` is process-wide, so
/// they cannot be tests of their own).
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `cuDeviceGetPCIBusId` into a buffer of `len` bytes that starts out
    /// as `0xAA`: the result and the buffer.
    fn pci_bus_id(len: usize, dev: CUdevice) -> (CUresult, Vec<u8>) {
        let mut buf = vec![0xAAu8; len];
        let ptr = if len == 0 {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast()
        };
        // SAFETY: `ptr` is null or valid for `len` bytes.
        let r = unsafe { cuDeviceGetPCIBusId(ptr, c_int::try_from(len).unwrap(), dev) };
        (r, buf)
    }

    pub(crate) fn pci_bus_id_before_init() {
        let (r, buf) = pci_bus_id(64, 0);
        assert_eq!(r, code::NOT_INITIALIZED);
        assert!(buf.iter().all(|&b| b == 0xAA), "nothing written");
    }

    pub(crate) fn pci_bus_id_after_init() {
        // One device (FAKE_CUDA_DEVICES unset), at the default address.
        let (r, buf) = pci_bus_id(64, 0);
        assert_eq!(r, code::SUCCESS);
        assert_eq!(&buf[..13], b"0000:18:00.0\0");
        assert!(buf[13..].iter().all(|&b| b == 0xAA), "nothing past the NUL");
        // Exactly the id and its NUL fit; one byte less does not, and
        // nothing is written.
        assert_eq!(pci_bus_id(13, 0).0, code::SUCCESS);
        let (r, buf) = pci_bus_id(12, 0);
        assert_eq!(r, code::INVALID_VALUE);
        assert!(buf.iter().all(|&b| b == 0xAA));
        // A null buffer.
        assert_eq!(pci_bus_id(0, 0).0, code::INVALID_VALUE);
        // SAFETY: a null buffer with a length: the call must check it.
        let r = unsafe { cuDeviceGetPCIBusId(std::ptr::null_mut(), 64, 0) };
        assert_eq!(r, code::INVALID_VALUE);
        // SAFETY: the buffer is valid for 4 bytes; a negative length is
        // refused before anything is written.
        let r = unsafe { cuDeviceGetPCIBusId([0 as c_char; 4].as_mut_ptr(), -1, 0) };
        assert_eq!(r, code::INVALID_VALUE);
        // A device that does not exist is reported first (the fake looks
        // the device up before it checks the buffer, as for names).
        assert_eq!(pci_bus_id(64, 1).0, code::INVALID_DEVICE);
        assert_eq!(pci_bus_id(0, 1).0, code::INVALID_DEVICE);
        assert_eq!(pci_bus_id(64, -1).0, code::INVALID_DEVICE);
    }
}
