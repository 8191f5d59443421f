//! The exported `ibv_*` entry points, the C structures they hand out, and
//! the emulation behind them: the one module of the double allowed
//! `unsafe`, since all of it is raw pointers across the C ABI.

#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Write;
use std::path::PathBuf;
use std::ptr;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

/// `struct ibv_device` (664 bytes on x86-64).
#[repr(C)]
pub struct IbvDevice {
    /// `struct _ibv_device_ops _ops`: two function pointers, unused here.
    pub ops: [*mut c_void; 2],
    /// `enum ibv_node_type node_type` (1: CA).
    pub node_type: c_int,
    /// `enum ibv_transport_type transport_type` (0: IB).
    pub transport_type: c_int,
    /// `char name[IBV_SYSFS_NAME_MAX]`.
    pub name: [c_char; 64],
    /// `char dev_name[IBV_SYSFS_NAME_MAX]`.
    pub dev_name: [c_char; 64],
    /// `char dev_path[IBV_SYSFS_PATH_MAX]`.
    pub dev_path: [c_char; 256],
    /// `char ibdev_path[IBV_SYSFS_PATH_MAX]`.
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context`: the real one starts with `struct ibv_device *device`;
/// the rest is the double's own.
#[repr(C)]
pub struct IbvContext {
    /// `struct ibv_device *device`.
    pub device: *mut IbvDevice,
    name: String,
}

/// `struct ibv_pd`: `context` and `handle` as in `verbs.h`, then the double's own.
#[repr(C)]
pub struct IbvPd {
    /// `struct ibv_context *context`.
    pub context: *mut IbvContext,
    /// `uint32_t handle`.
    pub handle: u32,
    name: String,
}

/// `struct ibv_mr` (48 bytes on x86-64).
#[repr(C)]
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

/// `struct ibv_device_attr` (232 bytes on x86-64), field for field.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// Which devices exist.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Devices {
    /// `ibv_get_device_list` fails with `ENOSYS`.
    Enosys,
    /// These names.
    Names(Vec<String>),
}

/// The behaviour asked for, from the environment.
#[derive(Debug, Clone)]
struct Config {
    devices: Devices,
    max_mr_size: u64,
    fail_reg_at: Option<(Option<String>, u64)>,
    fail_reg_errno: c_int,
    fail_dereg_at: Option<u64>,
    rendezvous: Option<usize>,
    rendezvous_timeout: Duration,
    log: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            devices: Devices::Names(vec!["mlx5_0".into()]),
            max_mr_size: 1 << 40,
            fail_reg_at: None,
            fail_reg_errno: libc::ENOMEM,
            fail_dereg_at: None,
            rendezvous: None,
            rendezvous_timeout: Duration::from_secs(10),
            log: None,
        }
    }
}

const ERRNOS: &[(&str, c_int)] = &[
    ("ENOMEM", libc::ENOMEM),
    ("EINVAL", libc::EINVAL),
    ("EFAULT", libc::EFAULT),
    ("EIO", libc::EIO),
    ("EPERM", libc::EPERM),
    ("EACCES", libc::EACCES),
    ("EBUSY", libc::EBUSY),
    ("ENOSYS", libc::ENOSYS),
    ("ENODEV", libc::ENODEV),
];

fn errno_name(e: c_int) -> String {
    ERRNOS
        .iter()
        .find(|(_, v)| *v == e)
        .map_or_else(|| format!("errno{e}"), |(n, _)| (*n).to_string())
}

fn parse_errno(s: &str) -> Option<c_int> {
    ERRNOS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s.trim()))
        .map(|(_, v)| *v)
        .or_else(|| s.trim().parse().ok())
}

impl Config {
    fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut c = Config::default();
        if let Some(d) = get("FAKE_IBV_DEVICES") {
            c.devices = if d.trim() == "ENOSYS" {
                Devices::Enosys
            } else {
                Devices::Names(
                    d.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                )
            };
        }
        if let Some(m) = get("FAKE_IBV_MAX_MR_SIZE").and_then(|v| v.trim().parse().ok()) {
            c.max_mr_size = m;
        }
        if let Some(v) = get("FAKE_IBV_FAIL_REG_AT") {
            c.fail_reg_at = match v.rsplit_once(':') {
                Some((dev, n)) => n.trim().parse().ok().map(|n| (Some(dev.to_string()), n)),
                None => v.trim().parse().ok().map(|n| (None, n)),
            };
        }
        if let Some(e) = get("FAKE_IBV_FAIL_REG_ERRNO").and_then(|v| parse_errno(&v)) {
            c.fail_reg_errno = e;
        }
        c.fail_dereg_at = get("FAKE_IBV_FAIL_DEREG_AT").and_then(|v| v.trim().parse().ok());
        c.rendezvous = get("FAKE_IBV_REG_RENDEZVOUS").and_then(|v| v.trim().parse().ok());
        if let Some(ms) = get("FAKE_IBV_RENDEZVOUS_MS").and_then(|v| v.trim().parse().ok()) {
            c.rendezvous_timeout = Duration::from_millis(ms);
        }
        c.log = get("FAKE_IBV_LOG").map(PathBuf::from);
        c
    }

    fn log(&self, line: &str) {
        if let Some(path) = &self.log {
            let mut line = line.to_string();
            line.push('\n');
            // One write per line on an O_APPEND file: lines from parallel
            // threads do not interleave.
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = f.write_all(line.as_bytes());
            }
        }
    }
}

/// Live objects and counters.
struct State {
    contexts: BTreeMap<usize, usize>,
    pds: BTreeMap<usize, usize>,
    mrs: BTreeSet<usize>,
    reg_calls: u64,
    reg_calls_by_device: BTreeMap<String, u64>,
    dereg_calls: u64,
    next_key: u32,
    arrived: BTreeSet<String>,
}

/// The double's state: one per process (tests make their own).
struct Fake {
    state: Mutex<State>,
    arrivals: Condvar,
}

impl Fake {
    const fn new() -> Fake {
        Fake {
            state: Mutex::new(State {
                contexts: BTreeMap::new(),
                pds: BTreeMap::new(),
                mrs: BTreeSet::new(),
                reg_calls: 0,
                reg_calls_by_device: BTreeMap::new(),
                dereg_calls: 0,
                next_key: 0,
                arrived: BTreeSet::new(),
            }),
            arrivals: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

static FAKE: Fake = Fake::new();

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e }
}

fn tid() -> i64 {
    // SAFETY: gettid has no preconditions.
    i64::from(unsafe { libc::gettid() })
}

fn copy_name(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// Whether the page holding `addr` is mapped.
fn page_mapped(addr: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let start = addr & !(page - 1);
    let mut vec = 0u8;
    // SAFETY: mincore only reads page-table state for one page and writes one
    // byte into `vec`; on an unmapped page it fails with ENOMEM.
    unsafe { libc::mincore(start as *mut c_void, page, &mut vec) == 0 }
}

mod imp {
    use super::*;

    pub(crate) fn get_device_list(
        fake: &Fake,
        cfg: &Config,
        num: *mut c_int,
    ) -> Result<*mut *mut IbvDevice, c_int> {
        let names = match &cfg.devices {
            Devices::Enosys => {
                if !num.is_null() {
                    // SAFETY: the caller passes a valid out-pointer or NULL.
                    unsafe { *num = 0 };
                }
                cfg.log("ibv_get_device_list result=ENOSYS");
                return Err(libc::ENOSYS);
            }
            Devices::Names(n) => n.clone(),
        };
        let _ = fake;
        let mut list: Vec<*mut IbvDevice> = names
            .iter()
            .map(|name| {
                let mut dev = Box::new(IbvDevice {
                    ops: [ptr::null_mut(); 2],
                    node_type: 1,
                    transport_type: 0,
                    name: [0; 64],
                    dev_name: [0; 64],
                    dev_path: [0; 256],
                    ibdev_path: [0; 256],
                });
                copy_name(&mut dev.name, name);
                copy_name(&mut dev.dev_name, "uverbs0");
                copy_name(&mut dev.dev_path, "/sys/class/infiniband_verbs/uverbs0");
                copy_name(
                    &mut dev.ibdev_path,
                    &format!("/sys/class/infiniband/{name}"),
                );
                // Devices live for the process: an opened device outlives
                // the list, as in the real library.
                Box::into_raw(dev)
            })
            .collect();
        let n = list.len();
        list.push(ptr::null_mut());
        if !num.is_null() {
            // SAFETY: the caller passes a valid out-pointer or NULL.
            unsafe { *num = c_int::try_from(n).unwrap_or(c_int::MAX) };
        }
        cfg.log(&format!("ibv_get_device_list count={n} result=ok"));
        Ok(Box::into_raw(list.into_boxed_slice()).cast())
    }

    pub(crate) fn free_device_list(cfg: &Config, list: *mut *mut IbvDevice) {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: `list` came from `get_device_list`: NULL-terminated.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: `list` is the boxed slice of n + 1 pointers made above,
        // freed once.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) });
        cfg.log("ibv_free_device_list result=ok");
    }

    fn device_name(dev: *mut IbvDevice) -> String {
        if dev.is_null() {
            return String::new();
        }
        // SAFETY: devices are never freed and their name is NUL-terminated.
        unsafe { CStr::from_ptr((*dev).name.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    pub(crate) fn open_device(
        fake: &Fake,
        cfg: &Config,
        dev: *mut IbvDevice,
    ) -> Result<*mut IbvContext, c_int> {
        if dev.is_null() {
            cfg.log("ibv_open_device dev=NULL result=EINVAL");
            return Err(libc::EINVAL);
        }
        let name = device_name(dev);
        let ctx = Box::into_raw(Box::new(IbvContext {
            device: dev,
            name: name.clone(),
        }));
        fake.lock().contexts.insert(ctx as usize, 0);
        cfg.log(&format!(
            "ibv_open_device dev={name} tid={} result=ok",
            tid()
        ));
        Ok(ctx)
    }

    pub(crate) fn close_device(
        fake: &Fake,
        cfg: &Config,
        ctx: *mut IbvContext,
    ) -> Result<(), c_int> {
        let mut st = fake.lock();
        match st.contexts.get(&(ctx as usize)).copied() {
            None => {
                drop(st);
                cfg.log("ibv_close_device dev=UNKNOWN result=EINVAL");
                Err(libc::EINVAL)
            }
            Some(pds) if pds > 0 => {
                drop(st);
                // SAFETY: a known context is a live box of ours.
                let name = unsafe { &(*ctx).name };
                cfg.log(&format!(
                    "ibv_close_device dev={name} pds={pds} result=EBUSY"
                ));
                Err(libc::EBUSY)
            }
            Some(_) => {
                st.contexts.remove(&(ctx as usize));
                drop(st);
                // SAFETY: a known context is a live box of ours, freed once
                // (it was just removed from the live set).
                let ctx = unsafe { Box::from_raw(ctx) };
                cfg.log(&format!("ibv_close_device dev={} result=ok", ctx.name));
                Ok(())
            }
        }
    }

    pub(crate) fn alloc_pd(
        fake: &Fake,
        cfg: &Config,
        ctx: *mut IbvContext,
    ) -> Result<*mut IbvPd, c_int> {
        let mut st = fake.lock();
        let Some(count) = st.contexts.get_mut(&(ctx as usize)) else {
            drop(st);
            cfg.log("ibv_alloc_pd dev=UNKNOWN result=EINVAL");
            return Err(libc::EINVAL);
        };
        *count += 1;
        // SAFETY: a known context is a live box of ours.
        let name = unsafe { (*ctx).name.clone() };
        let pd = Box::into_raw(Box::new(IbvPd {
            context: ctx,
            handle: u32::try_from(st.pds.len()).unwrap_or(0),
            name: name.clone(),
        }));
        st.pds.insert(pd as usize, 0);
        drop(st);
        cfg.log(&format!("ibv_alloc_pd dev={name} result=ok"));
        Ok(pd)
    }

    pub(crate) fn dealloc_pd(fake: &Fake, cfg: &Config, pd: *mut IbvPd) -> Result<(), c_int> {
        let mut st = fake.lock();
        match st.pds.get(&(pd as usize)).copied() {
            None => {
                drop(st);
                cfg.log("ibv_dealloc_pd dev=UNKNOWN result=EINVAL");
                Err(libc::EINVAL)
            }
            Some(mrs) if mrs > 0 => {
                drop(st);
                // SAFETY: a known PD is a live box of ours.
                let name = unsafe { &(*pd).name };
                cfg.log(&format!("ibv_dealloc_pd dev={name} mrs={mrs} result=EBUSY"));
                Err(libc::EBUSY)
            }
            Some(_) => {
                st.pds.remove(&(pd as usize));
                // SAFETY: a known PD is a live box of ours, freed once (it
                // was just removed from the live set).
                let pd = unsafe { Box::from_raw(pd) };
                if let Some(c) = st.contexts.get_mut(&(pd.context as usize)) {
                    *c = c.saturating_sub(1);
                }
                drop(st);
                cfg.log(&format!("ibv_dealloc_pd dev={} result=ok", pd.name));
                Ok(())
            }
        }
    }

    pub(crate) fn query_device(
        fake: &Fake,
        cfg: &Config,
        ctx: *mut IbvContext,
        attr: *mut IbvDeviceAttr,
    ) -> Result<(), c_int> {
        if attr.is_null() || !fake.lock().contexts.contains_key(&(ctx as usize)) {
            cfg.log("ibv_query_device dev=UNKNOWN result=EINVAL");
            return Err(libc::EINVAL);
        }
        // SAFETY: all-zero bytes are a valid `ibv_device_attr` (integers).
        let mut a: IbvDeviceAttr = unsafe { std::mem::zeroed() };
        copy_name(&mut a.fw_ver, "fake-ibverbs 1.0");
        a.max_mr_size = cfg.max_mr_size;
        a.page_size_cap = !0xfff;
        a.vendor_id = 0x02c9;
        a.max_mr = 1 << 24;
        a.max_pd = 1 << 24;
        a.max_pkeys = 128;
        a.phys_port_cnt = 1;
        // SAFETY: the caller passes a writable `ibv_device_attr`.
        unsafe { attr.write(a) };
        // SAFETY: a known context is a live box of ours.
        let name = unsafe { &(*ctx).name };
        cfg.log(&format!(
            "ibv_query_device dev={name} max_mr_size={} result=ok",
            cfg.max_mr_size
        ));
        Ok(())
    }

    /// Wait until `n` devices have entered `ibv_reg_mr`, or the timeout.
    fn rendezvous(fake: &Fake, cfg: &Config, name: &str, n: usize) {
        let mut st = fake.lock();
        if !st.arrived.insert(name.to_string()) {
            return;
        }
        fake.arrivals.notify_all();
        let deadline = Instant::now() + cfg.rendezvous_timeout;
        while st.arrived.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(st);
                cfg.log(&format!(
                    "rendezvous dev={name} tid={} result=timeout",
                    tid()
                ));
                return;
            }
            st = fake
                .arrivals
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        drop(st);
        cfg.log(&format!("rendezvous dev={name} tid={} result=ok", tid()));
    }

    pub(crate) fn reg_mr(
        fake: &Fake,
        cfg: &Config,
        pd: *mut IbvPd,
        addr: *mut c_void,
        len: usize,
        access: c_int,
    ) -> Result<*mut IbvMr, c_int> {
        let mut st = fake.lock();
        if !st.pds.contains_key(&(pd as usize)) {
            drop(st);
            cfg.log(&format!(
                "ibv_reg_mr dev=UNKNOWN addr={:#x} len={len} result=EINVAL",
                addr as usize
            ));
            return Err(libc::EINVAL);
        }
        // SAFETY: a known PD is a live box of ours.
        let (name, ctx) = unsafe { ((*pd).name.clone(), (*pd).context) };
        st.reg_calls += 1;
        let n = st.reg_calls;
        let n_dev = {
            let c = st.reg_calls_by_device.entry(name.clone()).or_insert(0);
            *c += 1;
            *c
        };
        drop(st);
        if let Some(k) = cfg.rendezvous {
            rendezvous(fake, cfg, &name, k);
        }
        let line = format!(
            "ibv_reg_mr dev={name} addr={:#x} len={len} access={access} n={n} tid={}",
            addr as usize,
            tid()
        );
        let refuse = |e: c_int, why: &str| {
            cfg.log(&format!("{line} reason={why} result={}", errno_name(e)));
            Err(e)
        };
        let len64 = u64::try_from(len).unwrap_or(u64::MAX);
        if addr.is_null() || len == 0 {
            return refuse(libc::EINVAL, "empty");
        }
        if len64 > cfg.max_mr_size {
            return refuse(libc::EINVAL, "longer-than-max_mr_size");
        }
        if access & IBV_ACCESS_REMOTE_WRITE != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0 {
            return refuse(libc::EINVAL, "remote-write-without-local-write");
        }
        let first = addr as usize;
        if !page_mapped(first) || !page_mapped(first.saturating_add(len - 1)) {
            return refuse(libc::EFAULT, "not-mapped");
        }
        if let Some((dev, at)) = &cfg.fail_reg_at {
            let hit = match dev {
                Some(d) => *d == name && n_dev == *at,
                None => n == *at,
            };
            if hit {
                return refuse(cfg.fail_reg_errno, "injected");
            }
        }
        let mut st = fake.lock();
        st.next_key += 1;
        let key = st.next_key;
        let mr = Box::into_raw(Box::new(IbvMr {
            context: ctx,
            pd,
            addr,
            length: len,
            handle: key,
            lkey: 0x1000 + key,
            rkey: 0x2000_0000 + key,
        }));
        st.mrs.insert(mr as usize);
        if let Some(c) = st.pds.get_mut(&(pd as usize)) {
            *c += 1;
        }
        drop(st);
        cfg.log(&format!(
            "{line} lkey={} rkey={} result=ok",
            0x1000 + key,
            0x2000_0000 + key
        ));
        Ok(mr)
    }

    pub(crate) fn dereg_mr(fake: &Fake, cfg: &Config, mr: *mut IbvMr) -> Result<(), c_int> {
        let mut st = fake.lock();
        st.dereg_calls += 1;
        let n = st.dereg_calls;
        if !st.mrs.contains(&(mr as usize)) {
            drop(st);
            cfg.log(&format!(
                "ibv_dereg_mr dev=UNKNOWN mr={:#x} n={n} reason=unknown-mr result=EINVAL",
                mr as usize
            ));
            return Err(libc::EINVAL);
        }
        // SAFETY: a known MR is a live box of ours; its PD outlives it.
        let (name, addr, len, pd) = unsafe {
            (
                (*(*mr).pd).name.clone(),
                (*mr).addr as usize,
                (*mr).length,
                (*mr).pd,
            )
        };
        let line = format!(
            "ibv_dereg_mr dev={name} addr={addr:#x} len={len} n={n} tid={}",
            tid()
        );
        if cfg.fail_dereg_at == Some(n) {
            drop(st);
            cfg.log(&format!("{line} reason=injected result=EBUSY"));
            return Err(libc::EBUSY);
        }
        st.mrs.remove(&(mr as usize));
        if let Some(c) = st.pds.get_mut(&(pd as usize)) {
            *c = c.saturating_sub(1);
        }
        drop(st);
        // SAFETY: a known MR is a live box of ours, freed once (it was just
        // removed from the live set).
        drop(unsafe { Box::from_raw(mr) });
        cfg.log(&format!("{line} result=ok"));
        Ok(())
    }
}

/// `ibv_get_device_list`: the devices of `FAKE_IBV_DEVICES`, or NULL with
/// `ENOSYS`.
///
/// # Safety
/// `num_devices` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut IbvDevice {
    imp::get_device_list(&FAKE, &Config::from_env(), num_devices).unwrap_or_else(|e| {
        set_errno(e);
        ptr::null_mut()
    })
}

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` came from [`ibv_get_device_list`] and is freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut IbvDevice) {
    imp::free_device_list(&Config::from_env(), list);
}

/// `ibv_get_device_name`.
///
/// # Safety
/// `device` came from [`ibv_get_device_list`] (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut IbvDevice) -> *const c_char {
    if device.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null();
    }
    // SAFETY: devices are never freed.
    unsafe { (*device).name.as_ptr() }
}

/// `ibv_open_device`.
///
/// # Safety
/// `device` came from [`ibv_get_device_list`] (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(device: *mut IbvDevice) -> *mut IbvContext {
    imp::open_device(&FAKE, &Config::from_env(), device).unwrap_or_else(|e| {
        set_errno(e);
        ptr::null_mut()
    })
}

/// `ibv_close_device`: 0, or -1 with `errno`.
///
/// # Safety
/// Any pointer: unknown contexts are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut IbvContext) -> c_int {
    match imp::close_device(&FAKE, &Config::from_env(), context) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// Any pointer: unknown contexts are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut IbvContext) -> *mut IbvPd {
    imp::alloc_pd(&FAKE, &Config::from_env(), context).unwrap_or_else(|e| {
        set_errno(e);
        ptr::null_mut()
    })
}

/// `ibv_dealloc_pd`: 0, or the errno value.
///
/// # Safety
/// Any pointer: unknown protection domains are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    match imp::dealloc_pd(&FAKE, &Config::from_env(), pd) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    }
}

/// `ibv_query_device`: 0, or the errno value.
///
/// # Safety
/// `device_attr` is a writable `struct ibv_device_attr`; unknown contexts
/// are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut IbvContext,
    device_attr: *mut IbvDeviceAttr,
) -> c_int {
    match imp::query_device(&FAKE, &Config::from_env(), context, device_attr) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    }
}

/// `ibv_reg_mr`: a region, or NULL with `errno`.
///
/// # Safety
/// Any pointers: unknown protection domains are refused, and the range is
/// only probed with `mincore`, never read or written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut IbvMr {
    imp::reg_mr(&FAKE, &Config::from_env(), pd, addr, length, access).unwrap_or_else(|e| {
        set_errno(e);
        ptr::null_mut()
    })
}

/// `ibv_dereg_mr`: 0, or the errno value.
///
/// # Safety
/// Any pointer: unknown regions are refused with `EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    match imp::dereg_mr(&FAKE, &Config::from_env(), mr) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn structs_match_verbs_h() {
        // offsetof() values of rdma-core 44.0's <infiniband/verbs.h>, x86-64.
        assert_eq!(size_of::<IbvDevice>(), 664);
        assert_eq!(offset_of!(IbvDevice, node_type), 16);
        assert_eq!(offset_of!(IbvDevice, name), 24);
        assert_eq!(offset_of!(IbvDevice, dev_name), 88);
        assert_eq!(offset_of!(IbvDevice, dev_path), 152);
        assert_eq!(offset_of!(IbvDevice, ibdev_path), 408);
        assert_eq!(offset_of!(IbvContext, device), 0);
        assert_eq!(offset_of!(IbvPd, context), 0);
        assert_eq!(offset_of!(IbvPd, handle), 8);
        assert_eq!(size_of::<IbvMr>(), 48);
        assert_eq!(offset_of!(IbvMr, addr), 16);
        assert_eq!(offset_of!(IbvMr, length), 24);
        assert_eq!(offset_of!(IbvMr, lkey), 36);
        assert_eq!(offset_of!(IbvMr, rkey), 40);
        assert_eq!(size_of::<IbvDeviceAttr>(), 232);
        assert_eq!(offset_of!(IbvDeviceAttr, max_mr_size), 80);
        assert_eq!(offset_of!(IbvDeviceAttr, phys_port_cnt), 227);
    }

    #[test]
    fn config_reads_every_variable() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            Config::from_lookup(env(&[])).devices,
            Devices::Names(vec!["mlx5_0".into()])
        );
        assert_eq!(
            Config::from_lookup(env(&[("FAKE_IBV_DEVICES", "")])).devices,
            Devices::Names(vec![])
        );
        assert_eq!(
            Config::from_lookup(env(&[("FAKE_IBV_DEVICES", "ENOSYS")])).devices,
            Devices::Enosys
        );
        let c = Config::from_lookup(env(&[
            ("FAKE_IBV_DEVICES", "a, b"),
            ("FAKE_IBV_MAX_MR_SIZE", "4096"),
            ("FAKE_IBV_FAIL_REG_AT", "b:3"),
            ("FAKE_IBV_FAIL_REG_ERRNO", "EFAULT"),
            ("FAKE_IBV_FAIL_DEREG_AT", "2"),
            ("FAKE_IBV_REG_RENDEZVOUS", "2"),
        ]));
        assert_eq!(c.devices, Devices::Names(vec!["a".into(), "b".into()]));
        assert_eq!(c.max_mr_size, 4096);
        assert_eq!(c.fail_reg_at, Some((Some("b".into()), 3)));
        assert_eq!(c.fail_reg_errno, libc::EFAULT);
        assert_eq!(c.fail_dereg_at, Some(2));
        assert_eq!(c.rendezvous, Some(2));
        assert_eq!(
            Config::from_lookup(env(&[("FAKE_IBV_FAIL_REG_AT", "5")])).fail_reg_at,
            Some((None, 5))
        );
    }

    /// A full cycle on this test's own state: limits and strictness.
    #[test]
    fn registers_checks_limits_and_refuses_unknown_or_busy_objects() {
        let fake = Fake::new();
        let cfg = Config {
            max_mr_size: 2 << 20,
            fail_reg_at: Some((None, 4)),
            ..Config::default()
        };
        let buf = vec![0u8; 8 << 20];
        let base = buf.as_ptr() as *mut c_void;
        let mut n = 0;
        let list = imp::get_device_list(&fake, &cfg, &mut n).unwrap();
        assert_eq!(n, 1);
        // SAFETY: the list has one device.
        let dev = unsafe { *list };
        let ctx = imp::open_device(&fake, &cfg, dev).unwrap();
        imp::free_device_list(&cfg, list);
        let pd = imp::alloc_pd(&fake, &cfg, ctx).unwrap();
        // SAFETY: all-zero bytes are a valid attr.
        let mut attr: IbvDeviceAttr = unsafe { std::mem::zeroed() };
        imp::query_device(&fake, &cfg, ctx, &mut attr).unwrap();
        assert_eq!(attr.max_mr_size, 2 << 20);

        let rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        let mr = imp::reg_mr(&fake, &cfg, pd, base, 2 << 20, rw).unwrap();
        assert_eq!(
            imp::reg_mr(&fake, &cfg, pd, base, (2 << 20) + 4096, rw).unwrap_err(),
            libc::EINVAL,
            "longer than max_mr_size"
        );
        assert_eq!(
            imp::reg_mr(&fake, &cfg, pd, base, 4096, IBV_ACCESS_REMOTE_WRITE).unwrap_err(),
            libc::EINVAL,
            "remote write needs local write"
        );
        assert_eq!(
            imp::reg_mr(&fake, &cfg, pd, base, 4096, rw).unwrap_err(),
            libc::ENOMEM,
            "the 4th call fails as asked"
        );
        assert_eq!(
            imp::reg_mr(&fake, &cfg, pd, 8 as *mut c_void, 4096, rw).unwrap_err(),
            libc::EFAULT,
            "an unmapped range"
        );
        // SAFETY: `mr` is live.
        let (addr, len, lkey, rkey) = unsafe { ((*mr).addr, (*mr).length, (*mr).lkey, (*mr).rkey) };
        assert_eq!((addr, len), (base, 2 << 20));
        assert_ne!(lkey, rkey);

        assert_eq!(imp::dealloc_pd(&fake, &cfg, pd).unwrap_err(), libc::EBUSY);
        assert_eq!(
            imp::close_device(&fake, &cfg, ctx).unwrap_err(),
            libc::EBUSY
        );
        imp::dereg_mr(&fake, &cfg, mr).unwrap();
        assert_eq!(
            imp::dereg_mr(&fake, &cfg, mr).unwrap_err(),
            libc::EINVAL,
            "a region deregistered twice is unknown"
        );
        imp::dealloc_pd(&fake, &cfg, pd).unwrap();
        imp::close_device(&fake, &cfg, ctx).unwrap();
        assert_eq!(
            imp::close_device(&fake, &cfg, ctx).unwrap_err(),
            libc::EINVAL
        );
        drop(buf);
    }

    #[test]
    fn enosys_returns_null_with_zero_devices() {
        let fake = Fake::new();
        let cfg = Config {
            devices: Devices::Enosys,
            ..Config::default()
        };
        let mut n = -7;
        assert_eq!(
            imp::get_device_list(&fake, &cfg, &mut n).unwrap_err(),
            libc::ENOSYS
        );
        assert_eq!(n, 0);
    }
}
