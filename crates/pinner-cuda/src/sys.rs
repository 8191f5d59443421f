//! The CUDA driver calls, resolved without ever panicking.
//!
//! cudarc (feature `dynamic-loading`) finds the driver library and opens it:
//! [`cu::is_culib_present`] tries its list of names (`libcuda.so`, …,
//! `libcuda.so.1`) and [`cu::culib`] keeps the first that opens. Its own
//! wrappers resolve each symbol lazily on first call and **panic** when the
//! library lacks it (`load`: `panic!("Missing symbol …")`), and they return
//! `CUresult` as a Rust enum, which a code newer than the bindings would make
//! undefined behaviour. So this module asks cudarc only for the library, and
//! resolves every symbol it will ever call up front, into [`Api`], with
//! `CUresult` taken as a plain `c_uint`: a driver lacking any of them is
//! reported by name ([`Load::MissingSymbols`]), and no symbol is called
//! before all of them are known to be there.
//!
//! The prototypes are those of `cuda.h` (CUDA 12.8), as in cudarc's
//! bindings, whose types (`CUdevice`, `CUcontext`, `CUdeviceptr`) and flag
//! constants are used here.

#![allow(unsafe_code)]
// `Api`'s fields are named after the driver symbols they hold.
#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::driver::sys as cu;
use pool_core::{Extent, Region};

/// A `CUresult` as the C ABI returns it.
pub(crate) type Status = c_uint;

const SUCCESS: Status = 0;
/// `CUDA_ERROR_NO_DEVICE`.
pub(crate) const NO_DEVICE: Status = 100;

macro_rules! api {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*); )*) => {
        /// Every driver entry point this crate calls.
        pub(crate) struct Api {
            $( $field: unsafe extern "C" fn($($arg),*) -> Status, )*
        }

        /// The symbols [`Api`] resolves, in declaration order.
        pub const SYMBOLS: &[&str] = &[$($sym),*];

        /// Resolve every symbol, or name the missing ones.
        fn resolve() -> Result<Api, Vec<&'static str>> {
            // SAFETY: `culib` panics only when no library opens; the caller
            // checked `is_culib_present` first, and the panic, should the
            // library vanish in between, is caught by `load`.
            let lib = unsafe { cu::culib() };
            let mut missing = Vec::new();
            $(
                // SAFETY: the function type is the symbol's C prototype in
                // `cuda.h`, with `CUresult` as `c_uint`; the library stays
                // loaded for the life of the process (cudarc keeps it in a
                // static), so the pointer never dangles.
                let $field = unsafe {
                    lib.get::<unsafe extern "C" fn($($arg),*) -> Status>(
                        concat!($sym, "\0").as_bytes(),
                    )
                }
                .ok()
                .map(|s| *s);
                if $field.is_none() {
                    missing.push($sym);
                }
            )*
            match ($($field,)*) {
                ($(Some($field),)*) => Ok(Api { $($field,)* }),
                _ => Err(missing),
            }
        }
    };
}

api! {
    cuInit = "cuInit": fn(c_uint);
    cuDriverGetVersion = "cuDriverGetVersion": fn(*mut c_int);
    cuDeviceGetCount = "cuDeviceGetCount": fn(*mut c_int);
    cuDeviceGet = "cuDeviceGet": fn(*mut cu::CUdevice, c_int);
    cuDeviceGetName = "cuDeviceGetName": fn(*mut c_char, c_int, cu::CUdevice);
    cuDeviceGetPCIBusId = "cuDeviceGetPCIBusId": fn(*mut c_char, c_int, cu::CUdevice);
    cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain": fn(*mut cu::CUcontext, cu::CUdevice);
    cuDevicePrimaryCtxRelease = "cuDevicePrimaryCtxRelease_v2": fn(cu::CUdevice);
    cuCtxGetCurrent = "cuCtxGetCurrent": fn(*mut cu::CUcontext);
    cuCtxSetCurrent = "cuCtxSetCurrent": fn(cu::CUcontext);
    cuCtxSynchronize = "cuCtxSynchronize": fn();
    cuMemHostRegister = "cuMemHostRegister_v2": fn(*mut c_void, usize, c_uint);
    cuMemHostUnregister = "cuMemHostUnregister": fn(*mut c_void);
    cuMemAlloc = "cuMemAlloc_v2": fn(*mut cu::CUdeviceptr, usize);
    cuMemFree = "cuMemFree_v2": fn(cu::CUdeviceptr);
    cuMemcpyHtoD = "cuMemcpyHtoD_v2": fn(cu::CUdeviceptr, *const c_void, usize);
    cuMemcpyDtoH = "cuMemcpyDtoH_v2": fn(*mut c_void, cu::CUdeviceptr, usize);
    cuGetErrorName = "cuGetErrorName": fn(Status, *mut *const c_char);
    cuGetErrorString = "cuGetErrorString": fn(Status, *mut *const c_char);
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("symbols", &SYMBOLS.len())
            .finish_non_exhaustive()
    }
}

/// `CU_MEMHOSTREGISTER_PORTABLE`.
pub(crate) const REGISTER_PORTABLE: c_uint = cu::CU_MEMHOSTREGISTER_PORTABLE;
/// `CU_MEMHOSTREGISTER_DEVICEMAP`.
pub(crate) const REGISTER_DEVICEMAP: c_uint = cu::CU_MEMHOSTREGISTER_DEVICEMAP;

/// Why the driver cannot be used.
#[derive(Debug, Clone)]
pub(crate) enum Load {
    /// No library of cudarc's names opens.
    NoLibrary,
    /// The library lacks these symbols (a driver older than the bindings).
    MissingSymbols(Vec<&'static str>),
    /// cudarc panicked while opening it (the message).
    Panicked(String),
}

/// The driver, loaded and complete, or why not. Checked once per process;
/// a missing library is checked again on each call (it may be installed
/// while a long-lived process runs, and checking is cheap).
pub(crate) fn load() -> Result<&'static Api, Load> {
    static API: OnceLock<Result<Api, Load>> = OnceLock::new();
    if let Some(done) = API.get() {
        return done.as_ref().map_err(Clone::clone);
    }
    // SAFETY: `is_culib_present` only opens and closes candidate libraries
    // (running their initialisers, as loading the driver always does).
    if !unsafe { cu::is_culib_present() } {
        return Err(Load::NoLibrary);
    }
    let outcome = match catch_unwind(resolve) {
        Ok(Ok(api)) => Ok(api),
        Ok(Err(missing)) => Err(Load::MissingSymbols(missing)),
        Err(p) => Err(Load::Panicked(panic_text(p.as_ref()))),
    };
    API.get_or_init(|| outcome).as_ref().map_err(Clone::clone)
}

/// The message of a caught panic.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_string())
}

/// Run `f`, turning a panic that escapes it into `Err(message)`. The last
/// line of defence: nothing here is known to panic.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_text(p.as_ref()))
}

/// A context handle (null: no context; making it current unbinds the
/// thread's context).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context(cu::CUcontext);

// SAFETY: a CUcontext is an opaque driver handle, not memory this process
// reads; the driver API allows making a context current on any thread
// (`cuCtxSetCurrent`), which is how every use here goes.
unsafe impl Send for Context {}
// SAFETY: as for Send; the handle is only copied, never dereferenced.
unsafe impl Sync for Context {}

/// The text a driver wrote into `buf`, up to its NUL (all of `buf` if it
/// wrote none).
fn until_nul(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn check(status: Status) -> Result<(), Status> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(status)
    }
}

impl Api {
    /// `cuInit(0)`.
    pub(crate) fn init(&self) -> Result<(), Status> {
        // SAFETY: no pointers; `cuInit` may be called any number of times.
        check(unsafe { (self.cuInit)(0) })
    }

    /// `cuDriverGetVersion`, e.g. 12080 for CUDA 12.8.
    pub(crate) fn driver_version(&self) -> Result<i32, Status> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a live, writable int.
        check(unsafe { (self.cuDriverGetVersion)(&mut v) })?;
        Ok(v)
    }

    /// `cuDeviceGetCount`.
    pub(crate) fn device_count(&self) -> Result<i32, Status> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a live, writable int.
        check(unsafe { (self.cuDeviceGetCount)(&mut n) })?;
        Ok(n)
    }

    /// `cuDeviceGet`.
    pub(crate) fn device(&self, ordinal: i32) -> Result<cu::CUdevice, Status> {
        let mut d: cu::CUdevice = 0;
        // SAFETY: `d` is a live, writable CUdevice.
        check(unsafe { (self.cuDeviceGet)(&mut d, ordinal) })?;
        Ok(d)
    }

    /// `cuDeviceGetName`.
    pub(crate) fn device_name(&self, device: cu::CUdevice) -> Result<String, Status> {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` is writable for its length, which is what we pass;
        // the driver NUL-terminates within it.
        check(unsafe {
            (self.cuDeviceGetName)(buf.as_mut_ptr().cast(), buf.len() as c_int, device)
        })?;
        Ok(until_nul(&buf))
    }

    /// `cuDeviceGetPCIBusId`: the device's PCI address as the driver writes
    /// it, `domain:bus:device.function` in hex (`0000:3B:00.0`). Needs
    /// `cuInit`, no context.
    pub(crate) fn pci_bus_id(&self, device: cu::CUdevice) -> Result<String, Status> {
        // The driver asks for 13 bytes (`0000:3B:00.0` and its NUL); wider
        // domains (`00000000:3B:00.0`) and any future form fit in 64.
        let mut buf = [0u8; 64];
        // SAFETY: `buf` is writable for its length, which is what we pass;
        // the driver NUL-terminates within it (or fails without writing).
        check(unsafe {
            (self.cuDeviceGetPCIBusId)(buf.as_mut_ptr().cast(), buf.len() as c_int, device)
        })?;
        Ok(until_nul(&buf))
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub(crate) fn retain_primary(&self, device: cu::CUdevice) -> Result<Context, Status> {
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a live, writable handle slot.
        check(unsafe { (self.cuDevicePrimaryCtxRetain)(&mut ctx, device) })?;
        Ok(Context(ctx))
    }

    /// `cuDevicePrimaryCtxRelease_v2`.
    pub(crate) fn release_primary(&self, device: cu::CUdevice) -> Result<(), Status> {
        // SAFETY: no pointers; releasing a context we retained.
        check(unsafe { (self.cuDevicePrimaryCtxRelease)(device) })
    }

    /// `cuCtxGetCurrent`: the calling thread's context ([`Context::NONE`]
    /// when it has none).
    pub(crate) fn current(&self) -> Result<Context, Status> {
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a live, writable handle slot.
        check(unsafe { (self.cuCtxGetCurrent)(&mut ctx) })?;
        Ok(Context(ctx))
    }

    /// `cuCtxSetCurrent` on the calling thread.
    pub(crate) fn set_current(&self, ctx: Context) -> Result<(), Status> {
        // SAFETY: null, or a handle the driver gave us; the driver checks
        // handles and answers CUDA_ERROR_INVALID_CONTEXT for a stale one.
        check(unsafe { (self.cuCtxSetCurrent)(ctx.0) })
    }

    /// `cuMemHostRegister_v2` of one extent of a region.
    ///
    /// Safe to call because [`Region`]'s constructor promises the range is
    /// mapped read-write for as long as the region is used, and the pool
    /// unpins before it unmaps; the driver only pins the pages.
    pub(crate) fn register(
        &self,
        region: &Region<'_>,
        chunk: Extent,
        flags: c_uint,
    ) -> Result<(), Status> {
        let (Some(ptr), Ok(len)) = (region.at(chunk.offset), usize::try_from(chunk.len)) else {
            return Err(1); // CUDA_ERROR_INVALID_VALUE: not inside the region
        };
        if chunk.end() > region.mapped_len() {
            return Err(1);
        }
        // SAFETY: `[ptr, ptr + len)` lies inside the region (checked above),
        // which is mapped read-write (Region's contract).
        check(unsafe { (self.cuMemHostRegister)(ptr.cast(), len, flags) })
    }

    /// `cuMemHostUnregister` of a range registered at `addr`.
    pub(crate) fn unregister(&self, addr: usize) -> Result<(), Status> {
        // SAFETY: the driver looks the pointer up in its own table of
        // registrations and does not dereference it; an unknown pointer is
        // an error code, not undefined behaviour.
        check(unsafe { (self.cuMemHostUnregister)(std::ptr::with_exposed_provenance_mut(addr)) })
    }

    /// `cuGetErrorName`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`, or `CUresult(n)`
    /// for a code this driver does not name.
    pub(crate) fn error_name(&self, status: Status) -> String {
        self.error_text(status, self.cuGetErrorName)
            .unwrap_or_else(|| format!("CUresult({status})"))
    }

    /// `cuGetErrorString`, e.g. `out of memory`.
    pub(crate) fn error_string(&self, status: Status) -> Option<String> {
        self.error_text(status, self.cuGetErrorString)
    }

    fn error_text(
        &self,
        status: Status,
        f: unsafe extern "C" fn(Status, *mut *const c_char) -> Status,
    ) -> Option<String> {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: `s` is a live, writable pointer slot.
        let r = unsafe { f(status, &mut s) };
        if r != SUCCESS || s.is_null() {
            return None;
        }
        // SAFETY: on success the driver stores a static NUL-terminated string.
        Some(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
    }

    /// `cuMemAlloc_v2`.
    pub(crate) fn mem_alloc(&self, bytes: usize) -> Result<cu::CUdeviceptr, Status> {
        let mut d: cu::CUdeviceptr = 0;
        // SAFETY: `d` is a live, writable slot.
        check(unsafe { (self.cuMemAlloc)(&mut d, bytes) })?;
        Ok(d)
    }

    /// `cuMemFree_v2`.
    pub(crate) fn mem_free(&self, d: cu::CUdeviceptr) -> Result<(), Status> {
        // SAFETY: an allocation of ours, freed once.
        check(unsafe { (self.cuMemFree)(d) })
    }

    /// `cuCtxSynchronize`.
    pub(crate) fn synchronize(&self) -> Result<(), Status> {
        // SAFETY: no arguments.
        check(unsafe { (self.cuCtxSynchronize)() })
    }

    /// Write a pattern into the first `len` bytes of `region`, copy them to
    /// `d` (`cuMemcpyHtoD_v2`, `cuCtxSynchronize`), zero them, copy them
    /// back (`cuMemcpyDtoH_v2`, `cuCtxSynchronize`) and compare. On error,
    /// the call that failed and its status.
    ///
    /// The host side is sound by construction: `len` is checked against the
    /// region, which no one else in this process can reach meanwhile
    /// ([`Exclusive`]). The device side is the driver's: `d` should be an
    /// allocation of `len` bytes with its context current; a wrong one is
    /// refused by the driver (`CUDA_ERROR_INVALID_VALUE`), it does not
    /// corrupt host memory.
    pub(crate) fn round_trip(
        &self,
        region: &mut Exclusive<'_>,
        d: cu::CUdeviceptr,
        len: usize,
    ) -> Result<RoundTrip, (&'static str, Status)> {
        let invalid = cu::CUresult::CUDA_ERROR_INVALID_VALUE as Status;
        let Some(bytes) = region.bytes(len) else {
            return Err(("the copy check's bounds", invalid));
        };
        let seed = 0x686f_7374_706f_6f6c ^ len as u64;
        fill(bytes, seed, None);
        let t = Instant::now();
        // SAFETY: the source is `len` host bytes we hold exclusively (see
        // Exclusive); the driver validates the device pointer.
        check(unsafe { (self.cuMemcpyHtoD)(d, bytes.as_ptr().cast(), len) })
            .map_err(|s| ("cuMemcpyHtoD", s))?;
        self.synchronize().map_err(|s| ("cuCtxSynchronize", s))?;
        let h2d_seconds = t.elapsed().as_secs_f64();
        fill(bytes, seed, Some(0));
        let t = Instant::now();
        // SAFETY: the destination is `len` host bytes we hold exclusively,
        // written by the device before cuCtxSynchronize returns.
        check(unsafe { (self.cuMemcpyDtoH)(bytes.as_mut_ptr().cast(), d, len) })
            .map_err(|s| ("cuMemcpyDtoH", s))?;
        self.synchronize().map_err(|s| ("cuCtxSynchronize", s))?;
        let d2h_seconds = t.elapsed().as_secs_f64();
        Ok(RoundTrip {
            h2d_seconds,
            d2h_seconds,
            first_mismatch: first_mismatch(bytes, seed),
        })
    }
}

/// Pool memory that nothing else in this process can reach while this
/// value lives: a region of a pool held by `&mut`, so no other borrow of the
/// pool, and so no other [`Region`] of it, exists. (Peer processes of a
/// shared pool are outside this process; the CLI copies only through the
/// rank's own shard.)
#[derive(Debug)]
pub struct Exclusive<'a> {
    region: Region<'a>,
    _pool: std::marker::PhantomData<&'a mut pool_core::Pool>,
}

impl<'a> Exclusive<'a> {
    /// The part `extent` of the pool's memory, or `None` when the pool is
    /// torn down or the extent is empty, outside it or not page-aligned.
    pub fn new(pool: &'a mut pool_core::Pool, extent: Extent) -> Option<Exclusive<'a>> {
        let pool: &'a pool_core::Pool = pool;
        let region = pool.region()?.sub(extent)?;
        Some(Exclusive {
            region,
            _pool: std::marker::PhantomData,
        })
    }

    /// The region.
    pub fn region(&self) -> &Region<'a> {
        &self.region
    }

    fn bytes(&mut self, len: usize) -> Option<&mut [u8]> {
        if len as u64 > self.region.mapped_len() {
            return None;
        }
        // SAFETY: `len` bytes from the start of the region are mapped
        // read-write for 'a; the `&mut Pool` this value was made from means
        // no other reference or Region into the pool exists in this process
        // while the slice (borrowed from `&mut self`) lives.
        Some(unsafe { std::slice::from_raw_parts_mut(self.region.addr(), len) })
    }
}

/// Timings and outcome of [`Api::round_trip`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundTrip {
    pub(crate) h2d_seconds: f64,
    pub(crate) d2h_seconds: f64,
    pub(crate) first_mismatch: Option<u64>,
}

/// The test pattern's word at `index` (splitmix64).
fn pattern_word(index: u64, seed: u64) -> [u8; 8] {
    let mut z = index ^ seed;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).to_le_bytes()
}

/// Fill `bytes` with the pattern for `seed` (`fill = None`) or with one
/// byte value.
fn fill(bytes: &mut [u8], seed: u64, fill: Option<u8>) {
    match fill {
        Some(b) => bytes.fill(b),
        None => {
            for (i, word) in bytes.chunks_mut(8).enumerate() {
                let p = pattern_word(i as u64, seed);
                word.copy_from_slice(&p[..word.len()]);
            }
        }
    }
}

/// The offset of the first byte that differs from the pattern for `seed`.
fn first_mismatch(bytes: &[u8], seed: u64) -> Option<u64> {
    bytes.chunks(8).enumerate().find_map(|(i, word)| {
        let p = pattern_word(i as u64, seed);
        word.iter()
            .zip(p)
            .position(|(&a, b)| a != b)
            .map(|j| (i * 8 + j) as u64)
    })
}
