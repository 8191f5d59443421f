//! The exported C functions (all `unsafe` by nature: raw handles).
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

type Status = c_int;
const OK: Status = 0;
const INVALID_PARAM: Status = -1;
const BACKEND: Status = -2;
const INVALID_STATE: Status = -3;
const NOT_FOUND: Status = -6;

static REGISTER_CALLS: AtomicU64 = AtomicU64::new(0);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

fn log(line: &str) {
    if let Some(path) = std::env::var_os("FAKE_NIXL_LOG") {
        static LOCK: Mutex<()> = Mutex::new(());
        let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

struct Agent {
    name: String,
    registered: Mutex<Vec<(usize, usize)>>,
}

#[derive(Default)]
struct List {
    descs: Vec<(usize, usize, u64)>,
}

unsafe fn name_of(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

unsafe fn out<T>(p: *mut *mut c_void, v: T) -> Status {
    if p.is_null() {
        return INVALID_PARAM;
    }
    // SAFETY: a valid out-pointer.
    unsafe { *p = Box::into_raw(Box::new(v)).cast() };
    OK
}

unsafe fn free<T>(p: *mut c_void) -> Status {
    if p.is_null() {
        return INVALID_PARAM;
    }
    // SAFETY: made by `out::<T>`, freed once.
    drop(unsafe { Box::from_raw(p.cast::<T>()) });
    OK
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_is_stub() -> bool {
    std::env::var("FAKE_NIXL_STUB").is_ok_and(|v| v.trim() == "1")
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_agent(
    name: *const c_char,
    agent: *mut *mut c_void,
) -> Status {
    // SAFETY: as the C API.
    let name = unsafe { name_of(name) };
    log(&format!("create_agent name={name} result=0"));
    // SAFETY: as the C API.
    unsafe {
        out(
            agent,
            Agent {
                name,
                registered: Mutex::new(Vec::new()),
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_configured_agent(
    name: *const c_char,
    _cfg: *const c_void,
    agent: *mut *mut c_void,
) -> Status {
    // SAFETY: as the C API.
    unsafe { nixl_capi_create_agent(name, agent) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_agent(agent: *mut c_void) -> Status {
    if agent.is_null() {
        return INVALID_PARAM;
    }
    // SAFETY: a live agent of ours.
    let a = unsafe { &*agent.cast::<Agent>() };
    let live = a.registered.lock().unwrap_or_else(|p| p.into_inner()).len();
    if live > 0 {
        log(&format!(
            "destroy_agent name={} live={live} result={INVALID_STATE}",
            a.name
        ));
        return INVALID_STATE;
    }
    log(&format!("destroy_agent name={} result=0", a.name));
    // SAFETY: freed once.
    unsafe { free::<Agent>(agent) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_get_available_plugins(
    _agent: *mut c_void,
    list: *mut *mut c_void,
) -> Status {
    // SAFETY: as the C API.
    unsafe { out(list, vec![c"UCX".to_owned(), c"POSIX".to_owned()]) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_string_list_size(list: *mut c_void, size: *mut usize) -> Status {
    // SAFETY: a live list of ours and an out-pointer.
    unsafe { *size = (*list.cast::<Vec<std::ffi::CString>>()).len() };
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_string_list_get(
    list: *mut c_void,
    i: usize,
    s: *mut *const c_char,
) -> Status {
    // SAFETY: a live list of ours.
    let l = unsafe { &*list.cast::<Vec<std::ffi::CString>>() };
    match l.get(i) {
        // SAFETY: an out-pointer; the string lives with the list.
        Some(c) => unsafe { *s = c.as_ptr() },
        None => return INVALID_PARAM,
    }
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_string_list(list: *mut c_void) -> Status {
    // SAFETY: freed once.
    unsafe { free::<Vec<std::ffi::CString>>(list) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_params(params: *mut *mut c_void) -> Status {
    // SAFETY: an out-pointer.
    unsafe { out(params, Vec::<(String, String)>::new()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_params_add(
    params: *mut c_void,
    k: *const c_char,
    v: *const c_char,
) -> Status {
    // SAFETY: live params and strings.
    unsafe { (*params.cast::<Vec<(String, String)>>()).push((name_of(k), name_of(v))) };
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_params(params: *mut c_void) -> Status {
    // SAFETY: freed once.
    unsafe { free::<Vec<(String, String)>>(params) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_backend(
    _agent: *mut c_void,
    plugin: *const c_char,
    params: *mut c_void,
    backend: *mut *mut c_void,
) -> Status {
    // SAFETY: as the C API.
    let plugin = unsafe { name_of(plugin) };
    // SAFETY: live params.
    let p = unsafe { &*params.cast::<Vec<(String, String)>>() };
    let shown: Vec<String> = p.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let known = plugin == "UCX" || plugin == "POSIX";
    if !known || std::env::var("FAKE_NIXL_NO_BACKEND").is_ok_and(|v| v.trim() == "1") {
        log(&format!(
            "create_backend plugin={plugin} params={} result={NOT_FOUND}",
            shown.join(",")
        ));
        return NOT_FOUND;
    }
    log(&format!(
        "create_backend plugin={plugin} params={} result=0",
        shown.join(",")
    ));
    // SAFETY: an out-pointer.
    unsafe { out(backend, plugin) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_backend(backend: *mut c_void) -> Status {
    // SAFETY: freed once.
    unsafe { free::<String>(backend) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_opt_args(args: *mut *mut c_void) -> Status {
    // SAFETY: an out-pointer.
    unsafe { out(args, 0u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_opt_args(args: *mut c_void) -> Status {
    // SAFETY: freed once.
    unsafe { free::<u64>(args) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_opt_args_add_backend(
    _args: *mut c_void,
    _backend: *mut c_void,
) -> Status {
    OK
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_opt_args_set_notif_msg(
    _args: *mut c_void,
    _d: *const c_void,
    _n: usize,
) -> Status {
    OK
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_opt_args_set_has_notif(_args: *mut c_void, _b: bool) -> Status {
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_reg_dlist(_mem: c_int, list: *mut *mut c_void) -> Status {
    // SAFETY: an out-pointer.
    unsafe { out(list, List::default()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_xfer_dlist(mem: c_int, list: *mut *mut c_void) -> Status {
    // SAFETY: as above.
    unsafe { nixl_capi_create_reg_dlist(mem, list) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_reg_dlist_add_desc(
    list: *mut c_void,
    addr: usize,
    len: usize,
    dev: u64,
    _md: *const c_void,
    _md_len: usize,
) -> Status {
    // SAFETY: a live list of ours.
    unsafe { (*list.cast::<List>()).descs.push((addr, len, dev)) };
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_xfer_dlist_add_desc(
    list: *mut c_void,
    addr: usize,
    len: usize,
    dev: u64,
) -> Status {
    // SAFETY: as above.
    unsafe { nixl_capi_reg_dlist_add_desc(list, addr, len, dev, std::ptr::null(), 0) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_reg_dlist(list: *mut c_void) -> Status {
    // SAFETY: freed once.
    unsafe { free::<List>(list) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_xfer_dlist(list: *mut c_void) -> Status {
    // SAFETY: freed once.
    unsafe { free::<List>(list) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_register_mem(
    agent: *mut c_void,
    list: *mut c_void,
    _opt: *mut c_void,
) -> Status {
    let n = REGISTER_CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    // SAFETY: a live agent and list of ours.
    let (a, l) = unsafe { (&*agent.cast::<Agent>(), &*list.cast::<List>()) };
    let descs: Vec<String> = l
        .descs
        .iter()
        .map(|(a, n, _)| format!("{a:#x}+{n}"))
        .collect();
    let status = if env_u64("FAKE_NIXL_FAIL_REGISTER_AT") == Some(n) {
        BACKEND
    } else if let Some(max) = env_u64("FAKE_NIXL_MAX_REGION")
        && l.descs.iter().any(|d| d.1 as u64 > max)
    {
        INVALID_PARAM
    } else {
        OK
    };
    if status == OK {
        a.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(l.descs.iter().map(|d| (d.0, d.1)));
    }
    log(&format!(
        "register_mem agent={} descs={} n={n} result={status}",
        a.name,
        descs.join(",")
    ));
    status
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_deregister_mem(
    agent: *mut c_void,
    list: *mut c_void,
    _opt: *mut c_void,
) -> Status {
    // SAFETY: a live agent and list of ours.
    let (a, l) = unsafe { (&*agent.cast::<Agent>(), &*list.cast::<List>()) };
    let mut reg = a.registered.lock().unwrap_or_else(|p| p.into_inner());
    let mut status = OK;
    for d in &l.descs {
        match reg.iter().position(|r| *r == (d.0, d.1)) {
            Some(i) => {
                reg.remove(i);
            }
            None => status = INVALID_PARAM,
        }
    }
    let descs: Vec<String> = l
        .descs
        .iter()
        .map(|(a, n, _)| format!("{a:#x}+{n}"))
        .collect();
    log(&format!(
        "deregister_mem agent={} descs={} result={status}",
        a.name,
        descs.join(",")
    ));
    status
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_get_local_md(
    agent: *mut c_void,
    data: *mut *mut c_void,
    len: *mut usize,
) -> Status {
    // SAFETY: a live agent of ours.
    let a = unsafe { &*agent.cast::<Agent>() };
    let md = format!("fake-nixl-md:{}", a.name);
    // SAFETY: malloc'ed as NIXL does, for the caller to free.
    unsafe {
        let p = libc::malloc(md.len());
        std::ptr::copy_nonoverlapping(md.as_ptr(), p.cast::<u8>(), md.len());
        *data = p;
        *len = md.len();
    }
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_load_remote_md(
    _agent: *mut c_void,
    data: *const c_void,
    len: usize,
    name: *mut *mut c_char,
) -> Status {
    // SAFETY: `len` bytes at `data`.
    let md = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    let Some(peer) = md.strip_prefix(b"fake-nixl-md:") else {
        return INVALID_PARAM;
    };
    let mut c = peer.to_vec();
    c.push(0);
    // SAFETY: strdup'ed as NIXL does, for the caller to free.
    unsafe { *name = libc::strdup(c.as_ptr().cast()) };
    OK
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_invalidate_remote_md(
    _agent: *mut c_void,
    _name: *const c_char,
) -> Status {
    OK
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_create_xfer_req(
    _agent: *mut c_void,
    _op: c_int,
    _l: *mut c_void,
    _r: *mut c_void,
    _peer: *const c_char,
    _req: *mut *mut c_void,
    _opt: *mut c_void,
) -> Status {
    // The double moves no data.
    NOT_FOUND
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_post_xfer_req(
    _a: *mut c_void,
    _r: *mut c_void,
    _o: *mut c_void,
) -> Status {
    INVALID_STATE
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_get_xfer_status(_a: *mut c_void, _r: *mut c_void) -> Status {
    INVALID_STATE
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_release_xfer_req(_a: *mut c_void, _r: *mut c_void) -> Status {
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_create_notif_map(map: *mut *mut c_void) -> Status {
    // SAFETY: an out-pointer.
    unsafe { out(map, 0u8) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_destroy_notif_map(map: *mut c_void) -> Status {
    // SAFETY: freed once.
    unsafe { free::<u8>(map) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_get_notifs(
    _a: *mut c_void,
    _m: *mut c_void,
    _o: *mut c_void,
) -> Status {
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nixl_capi_notif_map_size(_m: *mut c_void, n: *mut usize) -> Status {
    // SAFETY: an out-pointer.
    unsafe { *n = 0 };
    OK
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_notif_map_get_agent_at(
    _m: *mut c_void,
    _i: usize,
    _n: *mut *const c_char,
) -> Status {
    INVALID_PARAM
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_notif_map_get_notifs_size(
    _m: *mut c_void,
    _a: *const c_char,
    _n: *mut usize,
) -> Status {
    INVALID_PARAM
}

#[unsafe(no_mangle)]
pub extern "C" fn nixl_capi_notif_map_get_notif(
    _m: *mut c_void,
    _a: *const c_char,
    _i: usize,
    _d: *mut *const c_void,
    _n: *mut usize,
) -> Status {
    INVALID_PARAM
}
