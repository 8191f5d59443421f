//! `fake-cuda`: a test double of the CUDA driver library (`libcuda.so.1`).
//!
//! It exports, with C linkage, the driver calls that hostpool's `cuda`
//! pinner makes (see [`sys`] for the list), and emulates just enough of the
//! driver to test the pinner through the real FFI path: `dlopen` by cudarc,
//! `dlsym`, calls with raw pointers. It is loaded in place of the real
//! driver by pointing `LD_LIBRARY_PATH` of a child process at a directory
//! holding `libcuda.so.1` (and `libcuda.so`) linked to the built
//! `libfake_cuda.so`.
//!
//! # Behaviour, controlled by environment variables read at every call
//!
//! | variable | effect |
//! |---|---|
//! | `FAKE_CUDA_DEVICES` | device count (default 1); `0` makes `cuInit` return `CUDA_ERROR_NO_DEVICE` (100) |
//! | `FAKE_CUDA_FAIL_REGISTER_AT` | the Nth `cuMemHostRegister_v2` call of the process (1-based) returns `CUDA_ERROR_OUT_OF_MEMORY` (2) |
//! | `FAKE_CUDA_MAX_REGISTER_BYTES` | a registration of more bytes returns `CUDA_ERROR_INVALID_VALUE` (1) |
//! | `FAKE_CUDA_CORRUPT_COPY` | `1`: `cuMemcpyDtoH_v2` flips one byte of what it copies |
//! | `FAKE_CUDA_LOG` | a file that gets one line appended per call |
//! | `FAKE_CUDA_REGISTER_DELAY_MS` | every `cuMemHostRegister_v2` sleeps this long first: a slow driver, for background pinning |
//! | `FAKE_CUDA_PCI_BUS_IDS` | comma list of the PCI addresses `cuDeviceGetPCIBusId` gives devices 0, 1, …, written as they are (`0000:3B:00.0,00000000:86:00.0`); a device past the list, or with an empty entry, gets the default `0000:%02X:00.0` with bus `0x18 + 0x10 × n` ([`default_pci_bus_id`]) |
//!
//! Like the real driver it refuses:
//! - any call but `cuInit`, `cuDriverGetVersion` and `cuGetError*` before a
//!   successful `cuInit` (`CUDA_ERROR_NOT_INITIALIZED`, 3);
//! - an ordinal at or above the device count (`CUDA_ERROR_INVALID_DEVICE`, 101);
//! - a null name or PCI bus id buffer, or a PCI bus id buffer too short for
//!   the whole id and its NUL (`CUDA_ERROR_INVALID_VALUE`; names are
//!   truncated to fit, as the driver does);
//! - registering, unregistering, allocating or copying without a current
//!   context, or making a released context current
//!   (`CUDA_ERROR_INVALID_CONTEXT`, 201) — contexts are current per thread;
//! - registering a range that overlaps a registered one
//!   (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`, 712) and unregistering a
//!   pointer that does not start a registered range
//!   (`CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`, 713);
//! - device copies outside an allocation (`CUDA_ERROR_INVALID_VALUE`).
//!
//! Releasing the last reference to a primary context destroys it, and with
//! it the registrations made in it, as the real driver does.
//!
//! Device memory is host memory (`Vec<u8>`); "device pointers" are its
//! addresses.
//!
//! # Log format
//!
//! One line per call: the symbol, its arguments (pointers in hexadecimal,
//! sizes and flags in decimal), `->` and the name of the result, e.g.
//!
//! ```text
//! cuMemHostRegister_v2 0x7f3a40000000 68719476736 1 -> CUDA_SUCCESS
//! cuMemHostUnregister 0x7f3a40000000 -> CUDA_SUCCESS
//! cuDevicePrimaryCtxRelease_v2 0 live_registrations=0 -> CUDA_SUCCESS
//! cuMemcpyHtoD_v2 0x55d0c8a01000 0x7f3a40000000 8388608 registered=1 -> CUDA_SUCCESS
//! cuDeviceGetPCIBusId 64 1 -> CUDA_SUCCESS
//! ```

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io::Write;
use std::sync::{Mutex, MutexGuard};

pub mod sys;

/// Device count (default 1).
pub const ENV_DEVICES: &str = "FAKE_CUDA_DEVICES";
/// The 1-based `cuMemHostRegister_v2` call that fails with out-of-memory.
pub const ENV_FAIL_REGISTER_AT: &str = "FAKE_CUDA_FAIL_REGISTER_AT";
/// The largest registration accepted, in bytes.
pub const ENV_MAX_REGISTER_BYTES: &str = "FAKE_CUDA_MAX_REGISTER_BYTES";
/// `1`: device-to-host copies flip one byte.
pub const ENV_CORRUPT_COPY: &str = "FAKE_CUDA_CORRUPT_COPY";
/// The call log file.
pub const ENV_LOG: &str = "FAKE_CUDA_LOG";
/// Milliseconds every `cuMemHostRegister_v2` takes (default 0): a slow
/// driver, for background pinning.
pub const ENV_REGISTER_DELAY_MS: &str = "FAKE_CUDA_REGISTER_DELAY_MS";
/// Comma list of the PCI addresses of devices 0, 1, … (`cuDeviceGetPCIBusId`),
/// each written as it is; a missing or empty entry gets
/// [`default_pci_bus_id`].
pub const ENV_PCI_BUS_IDS: &str = "FAKE_CUDA_PCI_BUS_IDS";

/// The driver version `cuDriverGetVersion` reports (CUDA 12.8).
pub const DRIVER_VERSION: i32 = 12080;

/// `CUresult` codes the fake returns.
pub mod code {
    /// `CUDA_SUCCESS`
    pub const SUCCESS: u32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`
    pub const INVALID_VALUE: u32 = 1;
    /// `CUDA_ERROR_OUT_OF_MEMORY`
    pub const OUT_OF_MEMORY: u32 = 2;
    /// `CUDA_ERROR_NOT_INITIALIZED`
    pub const NOT_INITIALIZED: u32 = 3;
    /// `CUDA_ERROR_NO_DEVICE`
    pub const NO_DEVICE: u32 = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`
    pub const INVALID_DEVICE: u32 = 101;
    /// `CUDA_ERROR_INVALID_CONTEXT`
    pub const INVALID_CONTEXT: u32 = 201;
    /// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`
    pub const HOST_MEMORY_ALREADY_REGISTERED: u32 = 712;
    /// `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`
    pub const HOST_MEMORY_NOT_REGISTERED: u32 = 713;
}

const ERRORS: &[(u32, &CStr, &CStr)] = &[
    (code::SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        code::INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        code::OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        code::NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        code::NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        code::INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        code::INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        code::HOST_MEMORY_ALREADY_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        c"part or all of the requested memory range is already mapped",
    ),
    (
        code::HOST_MEMORY_NOT_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        c"pointer does not correspond to a registered memory region",
    ),
];

/// The name of a result code (`cuGetErrorName`), `None` for codes the fake
/// does not know.
pub fn error_name(code: u32) -> Option<&'static CStr> {
    ERRORS.iter().find(|e| e.0 == code).map(|e| e.1)
}

/// The description of a result code (`cuGetErrorString`).
pub fn error_string(code: u32) -> Option<&'static CStr> {
    ERRORS.iter().find(|e| e.0 == code).map(|e| e.2)
}

fn name_of(code: u32) -> String {
    error_name(code)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("CUresult({code})"))
}

/// Append `"{call} -> {result name}"` to the log, when one is asked for.
/// Errors writing the log are ignored: the fake must not fail a call for it.
pub(crate) fn log(call: &str, result: u32) {
    let Some(path) = std::env::var_os(ENV_LOG) else {
        return;
    };
    let line = format!("{call} -> {}\n", name_of(result));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        // One write per line: O_APPEND keeps lines whole across threads.
        let _ = f.write_all(line.as_bytes());
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

fn device_count_setting() -> i32 {
    env_u64(ENV_DEVICES).map_or(1, |n| i32::try_from(n).unwrap_or(i32::MAX))
}

#[derive(Debug)]
struct Registration {
    len: usize,
    device: i32,
}

#[derive(Debug)]
struct State {
    initialized: bool,
    register_calls: u64,
    /// Registered host ranges by start address.
    registrations: BTreeMap<usize, Registration>,
    /// Device allocations by address.
    allocations: BTreeMap<u64, Vec<u8>>,
    /// Primary context reference counts by device.
    primary_refs: BTreeMap<i32, u32>,
}

static STATE: Mutex<State> = Mutex::new(State {
    initialized: false,
    register_calls: 0,
    registrations: BTreeMap::new(),
    allocations: BTreeMap::new(),
    primary_refs: BTreeMap::new(),
});

thread_local! {
    /// The context current on this thread (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn state() -> MutexGuard<'static, State> {
    // A panic never crosses the C boundary, so poison only means a panic in
    // a test of this crate; keep going with the data as it is.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The handle of a device's primary context.
fn context_of(device: i32) -> usize {
    (usize::try_from(device).unwrap_or(0) + 1) << 12
}

fn device_of(context: usize) -> Option<i32> {
    if context == 0 || context & 0xfff != 0 {
        return None;
    }
    i32::try_from((context >> 12) - 1).ok()
}

fn initialized(s: &State) -> Result<(), u32> {
    if s.initialized {
        Ok(())
    } else {
        Err(code::NOT_INITIALIZED)
    }
}

/// The device of the current context, when it is live.
fn current_device(s: &State) -> Result<i32, u32> {
    initialized(s)?;
    let device = device_of(CURRENT.with(Cell::get)).ok_or(code::INVALID_CONTEXT)?;
    if s.primary_refs.get(&device).copied().unwrap_or(0) == 0 {
        return Err(code::INVALID_CONTEXT);
    }
    Ok(device)
}

pub(crate) fn init() -> u32 {
    if device_count_setting() <= 0 {
        return code::NO_DEVICE;
    }
    state().initialized = true;
    code::SUCCESS
}

pub(crate) fn device_count() -> Result<i32, u32> {
    initialized(&state())?;
    Ok(device_count_setting())
}

pub(crate) fn device_get(ordinal: i32) -> Result<i32, u32> {
    initialized(&state())?;
    if ordinal < 0 || ordinal >= device_count_setting() {
        return Err(code::INVALID_DEVICE);
    }
    Ok(ordinal)
}

pub(crate) fn device_name(device: i32) -> Result<String, u32> {
    device_get(device)?;
    Ok(format!("fake-cuda device {device}"))
}

/// The PCI address device `device` has unless [`ENV_PCI_BUS_IDS`] says
/// otherwise: domain 0, bus `0x18 + 0x10 × device`, device 0, function 0,
/// in upper-case hex as the driver writes it (`0000:18:00.0`,
/// `0000:28:00.0`, …). Past bus `0xF8` (device 14) the domain counts up:
/// device 15 is `0001:18:00.0`.
pub fn default_pci_bus_id(device: u32) -> String {
    let (domain, slot) = (device / 15, device % 15);
    format!("{domain:04X}:{:02X}:00.0", 0x18 + 0x10 * slot)
}

/// The PCI address of `device` given the value of [`ENV_PCI_BUS_IDS`]
/// (`None`: unset): its entry in the list, trimmed, or the default.
pub fn pci_bus_id_from(device: u32, list: Option<&str>) -> String {
    list.and_then(|l| l.split(',').nth(device as usize))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map_or_else(|| default_pci_bus_id(device), str::to_string)
}

/// `cuDeviceGetPCIBusId`'s answer for a device.
pub(crate) fn pci_bus_id(device: i32) -> Result<String, u32> {
    let device = device_get(device)?;
    let list = std::env::var(ENV_PCI_BUS_IDS).ok();
    // `device_get` refused negative ordinals.
    Ok(pci_bus_id_from(device.unsigned_abs(), list.as_deref()))
}

pub(crate) fn primary_retain(device: i32) -> Result<usize, u32> {
    device_get(device)?;
    *state().primary_refs.entry(device).or_insert(0) += 1;
    Ok(context_of(device))
}

/// Returns the result and how many registrations were live in the context.
pub(crate) fn primary_release(device: i32) -> (u32, usize) {
    if let Err(e) = device_get(device) {
        return (e, 0);
    }
    let mut s = state();
    let live = s
        .registrations
        .values()
        .filter(|r| r.device == device)
        .count();
    let refs = s.primary_refs.entry(device).or_insert(0);
    if *refs == 0 {
        return (code::INVALID_CONTEXT, live);
    }
    *refs -= 1;
    if *refs == 0 {
        // The context is destroyed, and its registrations with it.
        s.registrations.retain(|_, r| r.device != device);
    }
    (code::SUCCESS, live)
}

pub(crate) fn ctx_get_current() -> Result<usize, u32> {
    initialized(&state())?;
    Ok(CURRENT.with(Cell::get))
}

pub(crate) fn ctx_set_current(context: usize) -> u32 {
    let s = state();
    if let Err(e) = initialized(&s) {
        return e;
    }
    if context != 0 {
        match device_of(context) {
            Some(d) if s.primary_refs.get(&d).copied().unwrap_or(0) > 0 => {}
            _ => return code::INVALID_CONTEXT,
        }
    }
    CURRENT.with(|c| c.set(context));
    code::SUCCESS
}

pub(crate) fn ctx_synchronize() -> u32 {
    match current_device(&state()) {
        Ok(_) => code::SUCCESS,
        Err(e) => e,
    }
}

pub(crate) fn host_register(addr: usize, len: usize, _flags: u32) -> u32 {
    if let Some(ms) = env_u64(ENV_REGISTER_DELAY_MS) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let mut s = state();
    let device = match current_device(&s) {
        Ok(d) => d,
        Err(e) => return e,
    };
    s.register_calls += 1;
    if env_u64(ENV_FAIL_REGISTER_AT) == Some(s.register_calls) {
        return code::OUT_OF_MEMORY;
    }
    if addr == 0 || len == 0 {
        return code::INVALID_VALUE;
    }
    if env_u64(ENV_MAX_REGISTER_BYTES).is_some_and(|max| len as u64 > max) {
        return code::INVALID_VALUE;
    }
    let Some(end) = addr.checked_add(len) else {
        return code::INVALID_VALUE;
    };
    // Registered ranges never overlap, so only the last one starting below
    // `end` can reach into [addr, end).
    if let Some((&start, r)) = s.registrations.range(..end).next_back()
        && start + r.len > addr
    {
        return code::HOST_MEMORY_ALREADY_REGISTERED;
    }
    s.registrations.insert(addr, Registration { len, device });
    code::SUCCESS
}

pub(crate) fn host_unregister(addr: usize) -> u32 {
    let mut s = state();
    if let Err(e) = current_device(&s) {
        return e;
    }
    match s.registrations.remove(&addr) {
        Some(_) => code::SUCCESS,
        None => code::HOST_MEMORY_NOT_REGISTERED,
    }
}

/// Whether `[addr, addr + len)` lies inside one registered range.
pub(crate) fn is_registered(addr: usize, len: usize) -> bool {
    let s = state();
    s.registrations
        .range(..=addr)
        .next_back()
        .is_some_and(|(&start, r)| addr.saturating_add(len) <= start + r.len)
}

pub(crate) fn mem_alloc(size: usize) -> Result<u64, u32> {
    let mut s = state();
    current_device(&s)?;
    if size == 0 {
        return Err(code::INVALID_VALUE);
    }
    let mut buf = Vec::new();
    if buf.try_reserve_exact(size).is_err() {
        return Err(code::OUT_OF_MEMORY);
    }
    buf.resize(size, 0u8);
    let addr = buf.as_ptr() as u64;
    s.allocations.insert(addr, buf);
    Ok(addr)
}

pub(crate) fn mem_free(dptr: u64) -> u32 {
    let mut s = state();
    if let Err(e) = current_device(&s) {
        return e;
    }
    match s.allocations.remove(&dptr) {
        Some(_) => code::SUCCESS,
        None => code::INVALID_VALUE,
    }
}

/// Run `f` on `[dptr, dptr + len)` of one device allocation.
pub(crate) fn with_device_range<R>(
    dptr: u64,
    len: usize,
    f: impl FnOnce(&mut [u8]) -> R,
) -> Result<R, u32> {
    let mut s = state();
    current_device(&s)?;
    let (&start, buf) = s
        .allocations
        .range_mut(..=dptr)
        .next_back()
        .ok_or(code::INVALID_VALUE)?;
    let from = usize::try_from(dptr - start).map_err(|_| code::INVALID_VALUE)?;
    let to = from.checked_add(len).ok_or(code::INVALID_VALUE)?;
    let range = buf.get_mut(from..to).ok_or(code::INVALID_VALUE)?;
    Ok(f(range))
}

pub(crate) fn corrupt_copies() -> bool {
    std::env::var(ENV_CORRUPT_COPY).is_ok_and(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_name_and_a_description() {
        for (code, name, text) in ERRORS {
            assert_eq!(error_name(*code), Some(*name));
            assert_eq!(error_string(*code), Some(*text));
        }
        assert_eq!(error_name(9999), None);
        assert_eq!(name_of(9999), "CUresult(9999)");
    }

    /// The only test that touches the process-wide state.
    #[test]
    fn registrations_need_a_context_and_never_overlap() {
        // Before cuInit.
        assert_eq!(host_register(0x10000, 4096, 1), code::NOT_INITIALIZED);
        assert_eq!(pci_bus_id(0), Err(code::NOT_INITIALIZED));
        sys::tests::pci_bus_id_before_init();
        assert_eq!(init(), code::SUCCESS);
        // FAKE_CUDA_DEVICES and FAKE_CUDA_PCI_BUS_IDS are unset in the
        // crate's unit tests: one device, at the default address.
        assert_eq!(pci_bus_id(0).as_deref(), Ok("0000:18:00.0"));
        assert_eq!(pci_bus_id(1), Err(code::INVALID_DEVICE));
        assert_eq!(pci_bus_id(-1), Err(code::INVALID_DEVICE));
        sys::tests::pci_bus_id_after_init();
        // No current context on this thread yet.
        assert_eq!(host_register(0x10000, 4096, 1), code::INVALID_CONTEXT);
        assert_eq!(device_get(1), Err(code::INVALID_DEVICE));
        let ctx = primary_retain(0).unwrap();
        assert_eq!(ctx_set_current(ctx), code::SUCCESS);
        assert_eq!(host_register(0x10000, 0x2000, 1), code::SUCCESS);
        for (addr, len) in [(0x10000, 0x1000), (0x11000, 0x2000), (0xf000, 0x2000)] {
            assert_eq!(
                host_register(addr, len, 1),
                code::HOST_MEMORY_ALREADY_REGISTERED,
                "{addr:#x}+{len:#x}"
            );
        }
        assert_eq!(host_register(0x12000, 0x1000, 1), code::SUCCESS);
        assert!(is_registered(0x10800, 0x800));
        assert!(!is_registered(0x11800, 0x1000));
        assert_eq!(host_unregister(0x11000), code::HOST_MEMORY_NOT_REGISTERED);
        assert_eq!(host_unregister(0x12000), code::SUCCESS);
        assert_eq!(host_unregister(0x12000), code::HOST_MEMORY_NOT_REGISTERED);
        // Releasing the last reference destroys the context and what it holds.
        assert_eq!(primary_release(0), (code::SUCCESS, 1));
        assert_eq!(ctx_set_current(ctx), code::INVALID_CONTEXT);
        assert_eq!(primary_release(0), (code::INVALID_CONTEXT, 0));
        let d = {
            let ctx = primary_retain(0).unwrap();
            assert_eq!(ctx_set_current(ctx), code::SUCCESS);
            mem_alloc(16).unwrap()
        };
        assert_eq!(with_device_range(d + 8, 8, |b| b.len()), Ok(8));
        assert_eq!(
            with_device_range(d + 8, 9, |b| b.len()),
            Err(code::INVALID_VALUE)
        );
        assert_eq!(mem_free(d), code::SUCCESS);
        assert_eq!(mem_free(d), code::INVALID_VALUE);
    }

    #[test]
    fn default_pci_bus_ids_are_upper_case_distinct_and_sysfs_shaped() {
        assert_eq!(default_pci_bus_id(0), "0000:18:00.0");
        assert_eq!(default_pci_bus_id(1), "0000:28:00.0");
        assert_eq!(default_pci_bus_id(2), "0000:38:00.0");
        assert_eq!(default_pci_bus_id(9), "0000:A8:00.0");
        assert_eq!(default_pci_bus_id(14), "0000:F8:00.0");
        assert_eq!(default_pci_bus_id(15), "0001:18:00.0");
        let ids: std::collections::BTreeSet<String> = (0..64).map(default_pci_bus_id).collect();
        assert_eq!(ids.len(), 64, "every device has its own address");
        for id in &ids {
            // The driver's form: 4 hex digits of domain, 2 of bus, `00.0`.
            let b = id.as_bytes();
            assert_eq!((b.len(), b[4], b[7], b[10]), (12, b':', b':', b'.'), "{id}");
            assert!(!id.bytes().any(|c| c.is_ascii_lowercase()), "{id}");
        }
    }

    #[test]
    fn the_pci_bus_id_list_overrides_per_device_and_falls_back_to_the_default() {
        let list = Some(" 0000:3B:00.0, ,00000000:86:00.0");
        assert_eq!(pci_bus_id_from(0, list), "0000:3B:00.0");
        assert_eq!(pci_bus_id_from(1, list), "0000:28:00.0");
        assert_eq!(pci_bus_id_from(2, list), "00000000:86:00.0");
        assert_eq!(pci_bus_id_from(3, list), "0000:48:00.0");
        assert_eq!(pci_bus_id_from(0, None), "0000:18:00.0");
        assert_eq!(pci_bus_id_from(0, Some("")), "0000:18:00.0");
        // Written as given, even when it is no address: for error paths.
        assert_eq!(pci_bus_id_from(0, Some("garbage")), "garbage");
    }

    #[test]
    fn context_handles_round_trip_and_reject_garbage() {
        for d in [0, 1, 7] {
            assert_eq!(device_of(context_of(d)), Some(d));
        }
        assert_eq!(device_of(0), None);
        assert_eq!(device_of(0x1001), None);
    }
}
