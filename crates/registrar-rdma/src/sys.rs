//! The only `unsafe` code of the crate: libibverbs, loaded at run time with
//! `libloading`, and the C structures it hands back.
//!
//! The structures follow rdma-core's `infiniband/verbs.h` (checked against
//! rdma-core 44.0 with `offsetof` on x86-64; the layout has been stable since
//! libibverbs 1.1, the `IBVERBS_1.1` symbol version that `dlsym` returns):
//!
//! | struct | size | fields read here |
//! |---|---|---|
//! | `ibv_device_attr` | 232 | `max_mr_size` (`uint64_t`) at 80 |
//! | `ibv_mr` | 48 | `addr` at 16, `length` at 24, `lkey` at 36, `rkey` at 40 |
//! | `ibv_device`, `ibv_context`, `ibv_pd` | opaque | device names come from `ibv_get_device_name` |
//!
//! A [`Session`] owns one opened device, its protection domain and its
//! memory regions, and releases them in reverse (regions last-first, then the
//! protection domain, then the device) exactly once, whether it is closed or
//! dropped. Each session holds the library, so it stays loaded until the last
//! region is gone.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io;
use std::marker::{PhantomData, PhantomPinned};
use std::ptr::NonNull;
use std::sync::Arc;

use libloading::Library;
use pool_core::{Extent, Region};

/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

/// `struct ibv_device`, used only through pointers.
#[repr(C)]
pub struct IbvDevice {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `struct ibv_context`, used only through pointers.
#[repr(C)]
pub struct IbvContext {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `struct ibv_pd`, used only through pointers.
#[repr(C)]
pub struct IbvPd {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `struct ibv_device_attr` from `verbs.h`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbvDeviceAttr {
    /// `char fw_ver[64]`.
    pub fw_ver: [c_char; 64],
    /// `__be64 node_guid`.
    pub node_guid: u64,
    /// `__be64 sys_image_guid`.
    pub sys_image_guid: u64,
    /// `uint64_t max_mr_size`: the largest memory region the device registers.
    pub max_mr_size: u64,
    /// `uint64_t page_size_cap`.
    pub page_size_cap: u64,
    /// `uint32_t vendor_id`.
    pub vendor_id: u32,
    /// `uint32_t vendor_part_id`.
    pub vendor_part_id: u32,
    /// `uint32_t hw_ver`.
    pub hw_ver: u32,
    /// `int max_qp`.
    pub max_qp: c_int,
    /// `int max_qp_wr`.
    pub max_qp_wr: c_int,
    /// `unsigned int device_cap_flags`.
    pub device_cap_flags: u32,
    /// `int max_sge`.
    pub max_sge: c_int,
    /// `int max_sge_rd`.
    pub max_sge_rd: c_int,
    /// `int max_cq`.
    pub max_cq: c_int,
    /// `int max_cqe`.
    pub max_cqe: c_int,
    /// `int max_mr`.
    pub max_mr: c_int,
    /// `int max_pd`.
    pub max_pd: c_int,
    /// `int max_qp_rd_atom`.
    pub max_qp_rd_atom: c_int,
    /// `int max_ee_rd_atom`.
    pub max_ee_rd_atom: c_int,
    /// `int max_res_rd_atom`.
    pub max_res_rd_atom: c_int,
    /// `int max_qp_init_rd_atom`.
    pub max_qp_init_rd_atom: c_int,
    /// `int max_ee_init_rd_atom`.
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap atomic_cap`.
    pub atomic_cap: c_int,
    /// `int max_ee`.
    pub max_ee: c_int,
    /// `int max_rdd`.
    pub max_rdd: c_int,
    /// `int max_mw`.
    pub max_mw: c_int,
    /// `int max_raw_ipv6_qp`.
    pub max_raw_ipv6_qp: c_int,
    /// `int max_raw_ethy_qp`.
    pub max_raw_ethy_qp: c_int,
    /// `int max_mcast_grp`.
    pub max_mcast_grp: c_int,
    /// `int max_mcast_qp_attach`.
    pub max_mcast_qp_attach: c_int,
    /// `int max_total_mcast_qp_attach`.
    pub max_total_mcast_qp_attach: c_int,
    /// `int max_ah`.
    pub max_ah: c_int,
    /// `int max_fmr`.
    pub max_fmr: c_int,
    /// `int max_map_per_fmr`.
    pub max_map_per_fmr: c_int,
    /// `int max_srq`.
    pub max_srq: c_int,
    /// `int max_srq_wr`.
    pub max_srq_wr: c_int,
    /// `int max_srq_sge`.
    pub max_srq_sge: c_int,
    /// `uint16_t max_pkeys`.
    pub max_pkeys: u16,
    /// `uint8_t local_ca_ack_delay`.
    pub local_ca_ack_delay: u8,
    /// `uint8_t phys_port_cnt`.
    pub phys_port_cnt: u8,
}

/// `struct ibv_mr` from `verbs.h`, field for field.
#[repr(C)]
#[derive(Debug)]
pub struct IbvMr {
    /// `struct ibv_context *context`.
    pub context: *mut IbvContext,
    /// `struct ibv_pd *pd`.
    pub pd: *mut IbvPd,
    /// `void *addr`.
    pub addr: *mut c_void,
    /// `size_t length`.
    pub length: usize,
    /// `uint32_t handle`.
    pub handle: u32,
    /// `uint32_t lkey`.
    pub lkey: u32,
    /// `uint32_t rkey`.
    pub rkey: u32,
}

type GetDeviceListFn = unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice;
type FreeDeviceListFn = unsafe extern "C" fn(*mut *mut IbvDevice);
type GetDeviceNameFn = unsafe extern "C" fn(*mut IbvDevice) -> *const c_char;
type OpenDeviceFn = unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext;
type CloseDeviceFn = unsafe extern "C" fn(*mut IbvContext) -> c_int;
type AllocPdFn = unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd;
type DeallocPdFn = unsafe extern "C" fn(*mut IbvPd) -> c_int;
type QueryDeviceFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvDeviceAttr) -> c_int;
type RegMrFn = unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr;
type DeregMrFn = unsafe extern "C" fn(*mut IbvMr) -> c_int;

/// Why libibverbs could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// `dlopen` failed.
    Open(libloading::Error),
    /// A symbol is missing (a library that is not libibverbs, or far too old).
    Symbol(&'static str, libloading::Error),
}

/// The entry points of a loaded libibverbs. The function pointers stay valid
/// for as long as the library field is alive, that is, as long as this value.
#[derive(Debug)]
pub struct Verbs {
    get_device_list: GetDeviceListFn,
    free_device_list: FreeDeviceListFn,
    get_device_name: GetDeviceNameFn,
    open_device: OpenDeviceFn,
    close_device: CloseDeviceFn,
    alloc_pd: AllocPdFn,
    dealloc_pd: DeallocPdFn,
    query_device: QueryDeviceFn,
    reg_mr: RegMrFn,
    dereg_mr: DeregMrFn,
    _lib: Library,
}

macro_rules! symbol {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: `$ty` is the prototype `verbs.h` declares for `$name`
        // (exported with that ABI since IBVERBS_1.1); the pointer is copied
        // out and used only while the library stays loaded (it is stored next
        // to the `Library` in `Verbs`).
        let sym = unsafe { $lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
        *sym.map_err(|e| LoadError::Symbol($name, e))?
    }};
}

/// Read a C status return: `0` success, a positive errno (what libibverbs
/// documents for `ibv_dereg_mr`, `ibv_dealloc_pd`, `ibv_query_device`), `-1`
/// with `errno` set (`ibv_close_device`), or a negative errno (some providers).
fn status(rc: c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        -1 => Err(last_errno()),
        rc if rc < 0 => Err(io::Error::from_raw_os_error(rc.saturating_neg())),
        rc => Err(io::Error::from_raw_os_error(rc)),
    }
}

/// `errno` right after a failed call; `EIO` when the library left it unset.
fn last_errno() -> io::Error {
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => io::Error::from_raw_os_error(libc::EIO),
        _ => e,
    }
}

impl Verbs {
    /// `dlopen` the library (a bare name goes through the loader's search
    /// path, a name with a `/` is a file) and resolve every entry point.
    ///
    /// # Errors
    /// [`LoadError`] with libloading's error, whose source carries `dlerror()`.
    pub fn load(library: &str) -> Result<Verbs, LoadError> {
        // SAFETY: loading runs the library's initialisers. The library is
        // libibverbs (the system's by default, or the one the operator names
        // in `[rdma] library`), whose initialisers only read configuration
        // and sysfs and are sound in any process.
        let lib = unsafe { Library::new(library) }.map_err(LoadError::Open)?;
        Ok(Verbs {
            get_device_list: symbol!(lib, "ibv_get_device_list", GetDeviceListFn),
            free_device_list: symbol!(lib, "ibv_free_device_list", FreeDeviceListFn),
            get_device_name: symbol!(lib, "ibv_get_device_name", GetDeviceNameFn),
            open_device: symbol!(lib, "ibv_open_device", OpenDeviceFn),
            close_device: symbol!(lib, "ibv_close_device", CloseDeviceFn),
            alloc_pd: symbol!(lib, "ibv_alloc_pd", AllocPdFn),
            dealloc_pd: symbol!(lib, "ibv_dealloc_pd", DeallocPdFn),
            query_device: symbol!(lib, "ibv_query_device", QueryDeviceFn),
            reg_mr: symbol!(lib, "ibv_reg_mr", RegMrFn),
            dereg_mr: symbol!(lib, "ibv_dereg_mr", DeregMrFn),
            _lib: lib,
        })
    }

    /// `ibv_get_device_list`.
    ///
    /// # Errors
    /// The `errno` of a NULL return (`ENOSYS`: the kernel has no RDMA
    /// user verbs).
    pub fn device_list(&self) -> io::Result<DeviceList<'_>> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer for the call's duration.
        let list = unsafe { (self.get_device_list)(&mut n) };
        let Some(list) = NonNull::new(list) else {
            return Err(last_errno());
        };
        let mut devices = Vec::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` device pointers (NULL-terminated);
            // `i < n`.
            let dev = unsafe { *list.as_ptr().add(i) };
            let Some(dev) = NonNull::new(dev) else { break };
            // SAFETY: `dev` is a device of the live list.
            let name = unsafe { (self.get_device_name)(dev.as_ptr()) };
            let name = if name.is_null() {
                format!("device{i}")
            } else {
                // SAFETY: libibverbs returns the device's NUL-terminated name,
                // valid while the list (and the device) lives; it is copied.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            };
            devices.push(Device { ptr: dev, name });
        }
        Ok(DeviceList {
            verbs: self,
            list,
            devices,
        })
    }
}

/// The result of `ibv_get_device_list`, freed on drop.
#[derive(Debug)]
pub struct DeviceList<'v> {
    verbs: &'v Verbs,
    list: NonNull<*mut IbvDevice>,
    devices: Vec<Device>,
}

impl DeviceList<'_> {
    /// The devices, in the library's order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: the list came from this library's `ibv_get_device_list` and
        // is freed once. Devices opened from it hold their own reference
        // (libibverbs keeps an opened device alive until it is closed).
        unsafe { (self.verbs.free_device_list)(self.list.as_ptr()) }
    }
}

/// One device of a [`DeviceList`].
#[derive(Debug)]
pub struct Device {
    ptr: NonNull<IbvDevice>,
    name: String,
}

// SAFETY: a device pointer is only passed to `ibv_open_device`, which
// libibverbs allows from any thread ("all verbs are thread safe"); the list
// it belongs to outlives every borrow of it.
unsafe impl Send for Device {}
// SAFETY: as for Send; `&Device` gives the name and the open call only.
unsafe impl Sync for Device {}

impl Device {
    /// The kernel device name (`ibv_get_device_name`), e.g. `mlx5_0`.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One registered memory region.
#[derive(Debug)]
pub struct Mr {
    ptr: NonNull<IbvMr>,
    /// Where it lies in the pool.
    pub extent: Extent,
    /// Its address.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// The local key.
    pub lkey: u32,
    /// The remote key.
    pub rkey: u32,
}

/// A step of [`Session::close`] that failed.
#[derive(Debug)]
pub struct CloseFailure {
    /// `ibv_dereg_mr`, `ibv_dealloc_pd` or `ibv_close_device`.
    pub step: &'static str,
    /// The region, for `ibv_dereg_mr`: index, extent, address.
    pub region: Option<(usize, Extent, u64)>,
    /// The errno.
    pub error: io::Error,
}

/// An opened device with its protection domain and registered regions.
#[derive(Debug)]
pub struct Session {
    verbs: Arc<Verbs>,
    ctx: Option<NonNull<IbvContext>>,
    pd: Option<NonNull<IbvPd>>,
    mrs: Vec<Mr>,
}

// SAFETY: the handles are libibverbs objects, usable from any thread ("all
// verbs are thread safe"); a session is moved between threads, never shared
// for mutation (`register` and `close` take `&mut self` or `self`).
unsafe impl Send for Session {}
// SAFETY: through `&Session` only plain data (the regions' keys) and the
// thread-safe `ibv_query_device` are reachable.
unsafe impl Sync for Session {}

/// Which step of [`Session::open`] failed.
#[derive(Debug)]
pub struct OpenFailure {
    /// `ibv_open_device` or `ibv_alloc_pd`.
    pub step: &'static str,
    /// The errno.
    pub error: io::Error,
}

impl Session {
    /// `ibv_open_device` and `ibv_alloc_pd`. A failed `ibv_alloc_pd` closes
    /// the device again.
    ///
    /// # Errors
    /// The failing step and its errno.
    pub fn open(verbs: &Arc<Verbs>, device: &Device) -> Result<Session, OpenFailure> {
        // SAFETY: `device` belongs to a live device list of this library.
        let ctx = unsafe { (verbs.open_device)(device.ptr.as_ptr()) };
        let ctx = NonNull::new(ctx).ok_or_else(|| OpenFailure {
            step: "ibv_open_device",
            error: last_errno(),
        })?;
        let mut session = Session {
            verbs: Arc::clone(verbs),
            ctx: Some(ctx),
            pd: None,
            mrs: Vec::new(),
        };
        // SAFETY: `ctx` is the live context just opened.
        let pd = unsafe { (verbs.alloc_pd)(ctx.as_ptr()) };
        match NonNull::new(pd) {
            Some(pd) => {
                session.pd = Some(pd);
                Ok(session)
            }
            None => Err(OpenFailure {
                step: "ibv_alloc_pd",
                error: last_errno(),
            }),
            // `session` drops here and closes the device.
        }
    }

    /// `ibv_query_device(...).max_mr_size`.
    ///
    /// # Errors
    /// The errno `ibv_query_device` returned.
    pub fn max_mr_size(&self) -> io::Result<u64> {
        let ctx = self
            .ctx
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let mut attr = std::mem::MaybeUninit::<IbvDeviceAttr>::zeroed();
        // SAFETY: `ctx` is live; `attr` is a writable `ibv_device_attr` with
        // the C layout (see the offset test).
        status(unsafe { (self.verbs.query_device)(ctx.as_ptr(), attr.as_mut_ptr()) })?;
        // SAFETY: zero-initialised plain integers are a valid value, and the
        // call succeeded, so the library filled it in.
        Ok(unsafe { attr.assume_init() }.max_mr_size)
    }

    /// The regions registered so far, in order.
    pub fn regions(&self) -> &[Mr] {
        &self.mrs
    }

    /// `ibv_reg_mr` of `extent` of `region` with `access`.
    ///
    /// # Errors
    /// The errno of a NULL return; `EINVAL` without calling the library when
    /// the extent is not a page-aligned, non-empty part of the region.
    pub fn register(
        &mut self,
        region: &Region<'_>,
        extent: Extent,
        access: c_int,
    ) -> io::Result<&Mr> {
        let pd = self
            .pd
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let part = region
            .sub(extent)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let len = usize::try_from(part.mapped_len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `pd` is live. `[addr, addr + len)` is a page-aligned part of
        // a `Region`, mapped read-write for as long as the region is used
        // (its constructor's contract); the registrar's caller deregisters
        // before it unmaps (the `Registration` contract). The library only
        // records the address and asks the kernel to pin the pages.
        let mr = unsafe { (self.verbs.reg_mr)(pd.as_ptr(), part.addr().cast(), len, access) };
        let ptr = NonNull::new(mr).ok_or_else(last_errno)?;
        // SAFETY: a non-NULL return is a live `ibv_mr` owned by the library
        // until `ibv_dereg_mr`; the fields are read by value.
        let (lkey, rkey) = unsafe { ((*ptr.as_ptr()).lkey, (*ptr.as_ptr()).rkey) };
        self.mrs.push(Mr {
            ptr,
            extent,
            addr: part.addr() as u64,
            len: part.mapped_len(),
            lkey,
            rkey,
        });
        Ok(&self.mrs[self.mrs.len() - 1])
    }

    /// Deregister every region last-first, then free the protection domain,
    /// then close the device; carry on past failures and return them.
    pub fn close(mut self) -> Vec<CloseFailure> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Vec<CloseFailure> {
        let mut failures = Vec::new();
        while let Some(mr) = self.mrs.pop() {
            let index = self.mrs.len();
            // SAFETY: `mr.ptr` is a live region of this session, deregistered
            // once (it was popped).
            if let Err(error) = status(unsafe { (self.verbs.dereg_mr)(mr.ptr.as_ptr()) }) {
                failures.push(CloseFailure {
                    step: "ibv_dereg_mr",
                    region: Some((index, mr.extent, mr.addr)),
                    error,
                });
            }
        }
        if let Some(pd) = self.pd.take() {
            // SAFETY: `pd` is this session's live protection domain, freed once.
            if let Err(error) = status(unsafe { (self.verbs.dealloc_pd)(pd.as_ptr()) }) {
                failures.push(CloseFailure {
                    step: "ibv_dealloc_pd",
                    region: None,
                    error,
                });
            }
        }
        if let Some(ctx) = self.ctx.take() {
            // SAFETY: `ctx` is this session's live context, closed once.
            if let Err(error) = status(unsafe { (self.verbs.close_device)(ctx.as_ptr()) }) {
                failures.push(CloseFailure {
                    step: "ibv_close_device",
                    region: None,
                    error,
                });
            }
        }
        failures
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for f in self.shutdown() {
            tracing::warn!(
                step = f.step,
                "RDMA teardown could not undo a step: {}",
                f.error
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn ibv_device_attr_matches_verbs_h() {
        // offsetof() values printed by a C program built against rdma-core
        // 44.0's <infiniband/verbs.h> on x86-64.
        assert_eq!(size_of::<IbvDeviceAttr>(), 232);
        assert_eq!(align_of::<IbvDeviceAttr>(), 8);
        assert_eq!(offset_of!(IbvDeviceAttr, fw_ver), 0);
        assert_eq!(offset_of!(IbvDeviceAttr, node_guid), 64);
        assert_eq!(offset_of!(IbvDeviceAttr, sys_image_guid), 72);
        assert_eq!(offset_of!(IbvDeviceAttr, max_mr_size), 80);
        assert_eq!(offset_of!(IbvDeviceAttr, page_size_cap), 88);
        assert_eq!(offset_of!(IbvDeviceAttr, vendor_id), 96);
        assert_eq!(offset_of!(IbvDeviceAttr, vendor_part_id), 100);
        assert_eq!(offset_of!(IbvDeviceAttr, hw_ver), 104);
        assert_eq!(offset_of!(IbvDeviceAttr, max_qp), 108);
        assert_eq!(offset_of!(IbvDeviceAttr, device_cap_flags), 116);
        assert_eq!(offset_of!(IbvDeviceAttr, max_mr), 136);
        assert_eq!(offset_of!(IbvDeviceAttr, atomic_cap), 164);
        assert_eq!(offset_of!(IbvDeviceAttr, max_srq_sge), 220);
        assert_eq!(offset_of!(IbvDeviceAttr, max_pkeys), 224);
        assert_eq!(offset_of!(IbvDeviceAttr, local_ca_ack_delay), 226);
        assert_eq!(offset_of!(IbvDeviceAttr, phys_port_cnt), 227);
    }

    #[test]
    fn ibv_mr_matches_verbs_h() {
        assert_eq!(size_of::<IbvMr>(), 48);
        assert_eq!(offset_of!(IbvMr, context), 0);
        assert_eq!(offset_of!(IbvMr, pd), 8);
        assert_eq!(offset_of!(IbvMr, addr), 16);
        assert_eq!(offset_of!(IbvMr, length), 24);
        assert_eq!(offset_of!(IbvMr, handle), 32);
        assert_eq!(offset_of!(IbvMr, lkey), 36);
        assert_eq!(offset_of!(IbvMr, rkey), 40);
    }

    #[test]
    fn access_flags_match_verbs_h() {
        assert_eq!(
            (
                IBV_ACCESS_LOCAL_WRITE,
                IBV_ACCESS_REMOTE_WRITE,
                IBV_ACCESS_REMOTE_READ
            ),
            (1, 2, 4)
        );
    }

    #[test]
    fn status_reads_every_convention() {
        assert!(status(0).is_ok());
        assert_eq!(
            status(libc::EBUSY).unwrap_err().raw_os_error(),
            Some(libc::EBUSY)
        );
        assert_eq!(
            status(-libc::EINVAL).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn a_missing_library_is_an_open_error() {
        let e = Verbs::load("/nonexistent/libibverbs.so.1").unwrap_err();
        let LoadError::Open(e) = e else {
            panic!("{e:?}")
        };
        assert!(format!("{e:?}").contains("/nonexistent/libibverbs.so.1"));
    }
}
