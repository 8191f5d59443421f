//! The only `unsafe` code of the crate: NIXL's C API (`libnixl_capi.so`,
//! NIXL 1.5), loaded at run time with `libloading`, declared here function
//! for function from NIXL's `src/bindings/rust/wrapper.h`.
//!
//! An [`Agent`] owns a `nixl_capi_agent_t`, its backend and the optional
//! arguments naming that backend, and destroys them in reverse exactly once.
//! Memory is registered through a [`Registered`] guard that borrows the
//! pool's [`Region`], so it cannot outlive the memory; the registrar, whose
//! registration must be `'static`, uses [`Agent::register_unchecked`], whose
//! contract (deregister before the memory goes) `Pool`'s teardown order keeps.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::time::{Duration, Instant};

use libloading::Library;
use pool_core::{Extent, Region};

/// `nixl_capi_status_t`.
pub type Status = c_int;
/// `NIXL_CAPI_SUCCESS`.
pub const SUCCESS: Status = 0;
/// `NIXL_CAPI_IN_PROG`.
pub const IN_PROG: Status = 1;
/// `NIXL_CAPI_MEM_DRAM`.
const MEM_DRAM: c_int = 0;

/// A status's name, as `wrapper.h` spells it.
pub fn status_name(s: Status) -> &'static str {
    match s {
        0 => "NIXL_CAPI_SUCCESS",
        1 => "NIXL_CAPI_IN_PROG",
        -1 => "NIXL_CAPI_ERROR_INVALID_PARAM",
        -2 => "NIXL_CAPI_ERROR_BACKEND",
        -3 => "NIXL_CAPI_ERROR_INVALID_STATE",
        -4 => "NIXL_CAPI_ERROR_EXCEPTION",
        -5 => "NIXL_CAPI_ERROR_NO_TELEMETRY",
        -6 => "NIXL_CAPI_ERROR_NOT_FOUND",
        _ => "an unknown NIXL status",
    }
}

/// A C API call that failed: the function and its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The function, e.g. `nixl_capi_register_mem`.
    pub call: &'static str,
    /// Its status.
    pub status: Status,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} returned {} ({})",
            self.call,
            self.status,
            status_name(self.status)
        )
    }
}

impl std::error::Error for Failure {}

fn check(call: &'static str, status: Status) -> Result<(), Failure> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(Failure { call, status })
    }
}

type Raw = *mut c_void;

/// Why the library could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// `dlopen` failed.
    Open(libloading::Error),
    /// A function is missing: not NIXL 1.5's C API.
    Symbol(&'static str, libloading::Error),
    /// `nixl_capi_is_stub()` said true: the C API was built without NIXL.
    Stub,
}

macro_rules! api {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// NIXL's C API, loaded.
        pub struct Api {
            _lib: Library,
            $($name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Api {
            /// `dlopen` `path` and resolve every function used here.
            ///
            /// # Errors
            /// [`LoadError`].
            fn open(path: &str) -> Result<Api, LoadError> {
                // SAFETY: loading runs the library's initialisers; NIXL's C
                // API has no unusual ones (C++ static constructors).
                let lib = unsafe { Library::new(path) }.map_err(LoadError::Open)?;
                $(
                    // SAFETY: the type is the function's as `wrapper.h` declares it.
                    let $name = *unsafe {
                        lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!("nixl_capi_", stringify!($name), "\0").as_bytes(),
                        )
                    }
                    .map_err(|e| LoadError::Symbol(concat!("nixl_capi_", stringify!($name)), e))?;
                )*
                let api = Api { _lib: lib, $($name,)* };
                // SAFETY: `bool nixl_capi_is_stub(void)`.
                if unsafe { (api.is_stub)() } {
                    return Err(LoadError::Stub);
                }
                Ok(api)
            }
        }
    };
}

api! {
    is_stub: fn() -> bool;
    create_configured_agent: fn(*const c_char, *const AgentConfig, *mut Raw) -> Status;
    destroy_agent: fn(Raw) -> Status;
    get_available_plugins: fn(Raw, *mut Raw) -> Status;
    string_list_size: fn(Raw, *mut usize) -> Status;
    string_list_get: fn(Raw, usize, *mut *const c_char) -> Status;
    destroy_string_list: fn(Raw) -> Status;
    create_params: fn(*mut Raw) -> Status;
    params_add: fn(Raw, *const c_char, *const c_char) -> Status;
    destroy_params: fn(Raw) -> Status;
    create_backend: fn(Raw, *const c_char, Raw, *mut Raw) -> Status;
    destroy_backend: fn(Raw) -> Status;
    create_opt_args: fn(*mut Raw) -> Status;
    destroy_opt_args: fn(Raw) -> Status;
    opt_args_add_backend: fn(Raw, Raw) -> Status;
    opt_args_set_notif_msg: fn(Raw, *const c_void, usize) -> Status;
    opt_args_set_has_notif: fn(Raw, bool) -> Status;
    create_reg_dlist: fn(c_int, *mut Raw) -> Status;
    reg_dlist_add_desc: fn(Raw, usize, usize, u64, *const c_void, usize) -> Status;
    destroy_reg_dlist: fn(Raw) -> Status;
    register_mem: fn(Raw, Raw, Raw) -> Status;
    deregister_mem: fn(Raw, Raw, Raw) -> Status;
    get_local_md: fn(Raw, *mut *mut c_void, *mut usize) -> Status;
    load_remote_md: fn(Raw, *const c_void, usize, *mut *mut c_char) -> Status;
    invalidate_remote_md: fn(Raw, *const c_char) -> Status;
    create_xfer_dlist: fn(c_int, *mut Raw) -> Status;
    xfer_dlist_add_desc: fn(Raw, usize, usize, u64) -> Status;
    destroy_xfer_dlist: fn(Raw) -> Status;
    create_xfer_req: fn(Raw, c_int, Raw, Raw, *const c_char, *mut Raw, Raw) -> Status;
    post_xfer_req: fn(Raw, Raw, Raw) -> Status;
    get_xfer_status: fn(Raw, Raw) -> Status;
    release_xfer_req: fn(Raw, Raw) -> Status;
    create_notif_map: fn(*mut Raw) -> Status;
    destroy_notif_map: fn(Raw) -> Status;
    get_notifs: fn(Raw, Raw, Raw) -> Status;
    notif_map_size: fn(Raw, *mut usize) -> Status;
    notif_map_get_agent_at: fn(Raw, usize, *mut *const c_char) -> Status;
    notif_map_get_notifs_size: fn(Raw, *const c_char, *mut usize) -> Status;
    notif_map_get_notif: fn(Raw, *const c_char, usize, *mut *const c_void, *mut usize) -> Status;
}

impl Api {
    /// The C API at `path`, loaded once per process and never unloaded:
    /// NIXL and UCX start threads and register exit handlers that must not
    /// outlive their code (a `dlclose` crashed the process at exit).
    ///
    /// # Errors
    /// [`LoadError`]; a failed load is tried again on the next call.
    pub fn load(path: &str) -> Result<&'static Api, LoadError> {
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, api)) = loaded.iter().find(|(p, _)| p == path) {
            return Ok(api);
        }
        let api: &'static Api = Box::leak(Box::new(Api::open(path)?));
        loaded.push((path.to_string(), api));
        Ok(api)
    }

    /// Whether any library was loaded.
    pub fn any_loaded() -> bool {
        !LOADED.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }
}

/// Every library loaded, by path.
static LOADED: std::sync::Mutex<Vec<(String, &'static Api)>> = std::sync::Mutex::new(Vec::new());

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Api(libnixl_capi)")
    }
}

/// `nixl_capi_agent_config_t`.
#[repr(C)]
pub struct AgentConfig {
    enable_prog_thread: bool,
    enable_listen_thread: bool,
    listen_port: c_int,
    thread_sync: c_int,
    num_workers: std::ffi::c_uint,
    pthr_delay_us: u64,
    lthr_delay_us: u64,
    capture_telemetry: bool,
}

/// `READ` or `WRITE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Remote to local.
    Read,
    /// Local to remote.
    Write,
}

fn cstring(what: &'static str, s: &str) -> Result<CString, Failure> {
    CString::new(s).map_err(|_| Failure {
        call: what,
        status: -1,
    })
}

/// A NIXL agent with one backend.
#[derive(Debug)]
pub struct Agent {
    api: &'static Api,
    raw: Raw,
    backend: Raw,
    /// Optional arguments naming `backend`, passed to every call that takes them.
    opt: Raw,
    name: String,
}

// SAFETY: NIXL agents are thread-safe for the calls made here (NIXL's own
// Python binding shares one between threads); the handles are only passed
// back to the library.
unsafe impl Send for Agent {}
// SAFETY: as for Send.
unsafe impl Sync for Agent {}

impl Agent {
    /// Create the agent `name` (with a metadata listener on `listen_port`
    /// when given) and its backend `plugin` with its default parameters
    /// overridden by `params`. With `progress_thread` NIXL progresses
    /// transfers on a thread of its own, which polls without pause (a whole
    /// core, idle or not, with the nixl-cu12 1.5.1 wheel); without it they
    /// progress when this agent is called (`transfer`, `notifications`).
    ///
    /// # Errors
    /// The failing call; what was made is destroyed.
    pub fn new(
        api: &'static Api,
        name: &str,
        listen_port: Option<u16>,
        progress_thread: bool,
        plugin: &str,
        params: &[(String, String)],
    ) -> Result<Agent, Failure> {
        let c_name = cstring("nixl_capi_create_agent", name)?;
        let mut raw: Raw = std::ptr::null_mut();
        let cfg = AgentConfig {
            enable_prog_thread: progress_thread,
            enable_listen_thread: listen_port.is_some(),
            listen_port: c_int::from(listen_port.unwrap_or(0)),
            thread_sync: 0,
            num_workers: 1,
            pthr_delay_us: 0,
            lthr_delay_us: 100_000,
            capture_telemetry: false,
        };
        // SAFETY: a valid name, config and out-pointer.
        let status = unsafe { (api.create_configured_agent)(c_name.as_ptr(), &cfg, &mut raw) };
        check("nixl_capi_create_agent", status)?;
        let mut agent = Agent {
            api,
            raw,
            backend: std::ptr::null_mut(),
            opt: std::ptr::null_mut(),
            name: name.to_string(),
        };
        agent.create_backend(plugin, params)?;
        Ok(agent)
    }

    fn create_backend(&mut self, plugin: &str, params: &[(String, String)]) -> Result<(), Failure> {
        let api = self.api;
        let c_plugin = cstring("nixl_capi_create_backend", plugin)?;
        // Only the caller's parameters, as NIXL's own Python binding passes
        // them: the plugin fills in its defaults.
        let mut defaults: Raw = std::ptr::null_mut();
        // SAFETY: an out-pointer.
        check("nixl_capi_create_params", unsafe {
            (api.create_params)(&mut defaults)
        })?;
        let added = params.iter().try_for_each(|(k, v)| {
            let (k, v) = (
                cstring("nixl_capi_params_add", k)?,
                cstring("nixl_capi_params_add", v)?,
            );
            // SAFETY: live params and valid strings (copied by NIXL).
            check("nixl_capi_params_add", unsafe {
                (api.params_add)(defaults, k.as_ptr(), v.as_ptr())
            })
        });
        let made = added.and_then(|()| {
            // SAFETY: a live agent and params, a valid name and out-pointer.
            check("nixl_capi_create_backend", unsafe {
                (api.create_backend)(self.raw, c_plugin.as_ptr(), defaults, &mut self.backend)
            })
        });
        // SAFETY: made above, destroyed once.
        unsafe { (api.destroy_params)(defaults) };
        made?;
        // SAFETY: an out-pointer.
        check("nixl_capi_create_opt_args", unsafe {
            (api.create_opt_args)(&mut self.opt)
        })?;
        // SAFETY: live opt args and backend.
        check("nixl_capi_opt_args_add_backend", unsafe {
            (api.opt_args_add_backend)(self.opt, self.backend)
        })
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backend plugins NIXL finds (its plugin directory).
    ///
    /// # Errors
    /// The failing call.
    pub fn plugins(&self) -> Result<Vec<String>, Failure> {
        let api = self.api;
        let mut list: Raw = std::ptr::null_mut();
        // SAFETY: a live agent and an out-pointer.
        check("nixl_capi_get_available_plugins", unsafe {
            (api.get_available_plugins)(self.raw, &mut list)
        })?;
        let mut n = 0usize;
        // SAFETY: a live list.
        let sized = check("nixl_capi_string_list_size", unsafe {
            (api.string_list_size)(list, &mut n)
        });
        let mut out = Vec::new();
        if sized.is_ok() {
            for i in 0..n {
                let mut s: *const c_char = std::ptr::null();
                // SAFETY: `i` is below the list's size; the string lives as long as the list.
                if unsafe { (api.string_list_get)(list, i, &mut s) } == SUCCESS && !s.is_null() {
                    // SAFETY: a NUL-terminated string owned by the list.
                    out.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
                }
            }
        }
        // SAFETY: the list is destroyed once.
        unsafe { (api.destroy_string_list)(list) };
        sized.map(|()| out)
    }

    fn dlist(&self, regions: &[(usize, usize)], dev_id: u64) -> Result<Raw, Failure> {
        let api = self.api;
        let mut list: Raw = std::ptr::null_mut();
        // SAFETY: an out-pointer.
        check("nixl_capi_create_reg_dlist", unsafe {
            (api.create_reg_dlist)(MEM_DRAM, &mut list)
        })?;
        for &(addr, len) in regions {
            // SAFETY: a live list; NIXL copies the descriptor.
            let s =
                unsafe { (api.reg_dlist_add_desc)(list, addr, len, dev_id, std::ptr::null(), 0) };
            if let Err(e) = check("nixl_capi_reg_dlist_add_desc", s) {
                // SAFETY: destroyed once.
                unsafe { (api.destroy_reg_dlist)(list) };
                return Err(e);
            }
        }
        Ok(list)
    }

    /// Register `regions` (addresses and lengths) as DRAM with one call.
    ///
    /// # Safety
    /// The memory must stay mapped until [`Agent::deregister_unchecked`] of
    /// the same regions returns: NIXL and its peers read and write it.
    pub unsafe fn register_unchecked(
        &self,
        regions: &[(usize, usize)],
        dev_id: u64,
    ) -> Result<(), Failure> {
        let list = self.dlist(regions, dev_id)?;
        // SAFETY: live agent, list and opt args; the caller keeps the memory.
        let s = unsafe { (self.api.register_mem)(self.raw, list, self.opt) };
        // SAFETY: destroyed once.
        unsafe { (self.api.destroy_reg_dlist)(list) };
        check("nixl_capi_register_mem", s)
    }

    /// Deregister regions registered with [`Agent::register_unchecked`].
    ///
    /// # Errors
    /// The failing call.
    pub fn deregister_unchecked(
        &self,
        regions: &[(usize, usize)],
        dev_id: u64,
    ) -> Result<(), Failure> {
        let list = self.dlist(regions, dev_id)?;
        // SAFETY: live agent, list and opt args.
        let s = unsafe { (self.api.deregister_mem)(self.raw, list, self.opt) };
        // SAFETY: destroyed once.
        unsafe { (self.api.destroy_reg_dlist)(list) };
        check("nixl_capi_deregister_mem", s)
    }

    /// Register `extent` of `region` for as long as the guard lives (which
    /// the region's borrow bounds).
    ///
    /// # Errors
    /// The failing call, or `INVALID_PARAM` for an extent outside the region.
    pub fn register<'r>(
        &'r self,
        region: &Region<'r>,
        extent: Extent,
    ) -> Result<Registered<'r>, Failure> {
        let (ptr, len) = region.range(extent).map_err(|_| Failure {
            call: "nixl_capi_register_mem",
            status: -1,
        })?;
        let regions = [(ptr as usize, len)];
        // SAFETY: the guard borrows the region, so the memory outlives the
        // registration, which the guard's drop ends.
        unsafe { self.register_unchecked(&regions, 0) }?;
        Ok(Registered {
            agent: self,
            addr: ptr as usize,
            len,
            _region: std::marker::PhantomData,
        })
    }

    /// This agent's metadata, for a peer's [`Agent::load_remote`].
    ///
    /// # Errors
    /// The failing call.
    pub fn local_metadata(&self) -> Result<Vec<u8>, Failure> {
        let mut data: *mut c_void = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: a live agent and out-pointers.
        check("nixl_capi_get_local_md", unsafe {
            (self.api.get_local_md)(self.raw, &mut data, &mut len)
        })?;
        // SAFETY: NIXL malloc'ed `len` bytes at `data`; copied, then freed once.
        let out = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec();
        // SAFETY: as said.
        unsafe { libc::free(data) };
        Ok(out)
    }

    /// Load a peer's metadata; returns the peer agent's name.
    ///
    /// # Errors
    /// The failing call.
    pub fn load_remote(&self, metadata: &[u8]) -> Result<String, Failure> {
        let mut name: *mut c_char = std::ptr::null_mut();
        // SAFETY: a live agent, the bytes and an out-pointer.
        check("nixl_capi_load_remote_md", unsafe {
            (self.api.load_remote_md)(
                self.raw,
                metadata.as_ptr().cast(),
                metadata.len(),
                &mut name,
            )
        })?;
        // SAFETY: NIXL strdup'ed the name; copied, then freed once.
        let s = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as said.
        unsafe { libc::free(name.cast()) };
        Ok(s)
    }

    /// Forget a peer's metadata.
    ///
    /// # Errors
    /// The failing call.
    pub fn forget_remote(&self, peer: &str) -> Result<(), Failure> {
        let c = cstring("nixl_capi_invalidate_remote_md", peer)?;
        // SAFETY: a live agent and a valid name.
        check("nixl_capi_invalidate_remote_md", unsafe {
            (self.api.invalidate_remote_md)(self.raw, c.as_ptr())
        })
    }

    fn xfer_dlist(&self, descs: &[(usize, usize)]) -> Result<Raw, Failure> {
        let mut list: Raw = std::ptr::null_mut();
        // SAFETY: an out-pointer.
        check("nixl_capi_create_xfer_dlist", unsafe {
            (self.api.create_xfer_dlist)(MEM_DRAM, &mut list)
        })?;
        for &(addr, len) in descs {
            // SAFETY: a live list; copied.
            let s = unsafe { (self.api.xfer_dlist_add_desc)(list, addr, len, 0) };
            if let Err(e) = check("nixl_capi_xfer_dlist_add_desc", s) {
                // SAFETY: destroyed once.
                unsafe { (self.api.destroy_xfer_dlist)(list) };
                return Err(e);
            }
        }
        Ok(list)
    }

    /// Move `local.len()` bytes between `local` (inside a registration of
    /// this agent) and `remote_addr` on `peer` (registered there), wait until
    /// done, and send `notif` to the peer with it. `Op::Read` writes the
    /// local memory, `Op::Write` the peer's.
    ///
    /// # Errors
    /// The failing call; `NIXL_CAPI_ERROR_BACKEND` after `timeout`.
    #[allow(clippy::too_many_arguments)] // NIXL's own transfer call takes as many
    pub fn transfer(
        &self,
        op: Op,
        local: &Registered<'_>,
        local_extent: Extent,
        peer: &str,
        remote_addr: u64,
        notif: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<(), Failure> {
        let inside = local_extent
            .offset
            .checked_add(local_extent.len)
            .is_some_and(|end| end <= local.len as u64);
        if !inside || !std::ptr::eq(local.agent, self) {
            return Err(Failure {
                call: "nixl_capi_create_xfer_req",
                status: -1,
            });
        }
        let len = usize::try_from(local_extent.len).unwrap_or(usize::MAX);
        let local_addr = local.addr + usize::try_from(local_extent.offset).unwrap_or(usize::MAX);
        let remote_addr = usize::try_from(remote_addr).unwrap_or(usize::MAX);
        let c_peer = cstring("nixl_capi_create_xfer_req", peer)?;
        let l = self.xfer_dlist(&[(local_addr, len)])?;
        let r = match self.xfer_dlist(&[(remote_addr, len)]) {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: destroyed once.
                unsafe { (self.api.destroy_xfer_dlist)(l) };
                return Err(e);
            }
        };
        let api = self.api;
        let mut opt: Raw = std::ptr::null_mut();
        let mut req: Raw = std::ptr::null_mut();
        let result = (|| {
            // SAFETY: an out-pointer.
            check("nixl_capi_create_opt_args", unsafe {
                (api.create_opt_args)(&mut opt)
            })?;
            // SAFETY: live opt args and backend.
            check("nixl_capi_opt_args_add_backend", unsafe {
                (api.opt_args_add_backend)(opt, self.backend)
            })?;
            if let Some(msg) = notif {
                // SAFETY: live opt args; the message is copied.
                check("nixl_capi_opt_args_set_notif_msg", unsafe {
                    (api.opt_args_set_notif_msg)(opt, msg.as_ptr().cast(), msg.len())
                })?;
                // SAFETY: live opt args.
                check("nixl_capi_opt_args_set_has_notif", unsafe {
                    (api.opt_args_set_has_notif)(opt, true)
                })?;
            }
            let code = match op {
                Op::Read => 0,
                Op::Write => 1,
            };
            // SAFETY: live agent, lists and opt args; the local memory is a
            // live registration of this agent (checked above).
            check("nixl_capi_create_xfer_req", unsafe {
                (api.create_xfer_req)(self.raw, code, l, r, c_peer.as_ptr(), &mut req, opt)
            })?;
            // SAFETY: a live request.
            let posted = unsafe { (api.post_xfer_req)(self.raw, req, opt) };
            if posted != SUCCESS && posted != IN_PROG {
                return Err(Failure {
                    call: "nixl_capi_post_xfer_req",
                    status: posted,
                });
            }
            let start = Instant::now();
            let mut status = posted;
            while status == IN_PROG {
                if start.elapsed() > timeout {
                    return Err(Failure {
                        call: "nixl_capi_get_xfer_status",
                        status: -2,
                    });
                }
                std::thread::yield_now();
                // SAFETY: a live request.
                status = unsafe { (api.get_xfer_status)(self.raw, req) };
            }
            check("nixl_capi_get_xfer_status", status)
        })();
        // SAFETY: each destroyed once; a request still in flight after a
        // timeout is released by NIXL (it cancels it).
        unsafe {
            if !req.is_null() {
                (api.release_xfer_req)(self.raw, req);
            }
            if !opt.is_null() {
                (api.destroy_opt_args)(opt);
            }
            (api.destroy_xfer_dlist)(l);
            (api.destroy_xfer_dlist)(r);
        }
        result
    }

    /// Notifications received since the last call: `(peer, message)` each.
    ///
    /// # Errors
    /// The failing call.
    pub fn notifications(&self) -> Result<Vec<(String, Vec<u8>)>, Failure> {
        let api = self.api;
        let mut map: Raw = std::ptr::null_mut();
        // SAFETY: an out-pointer.
        check("nixl_capi_create_notif_map", unsafe {
            (api.create_notif_map)(&mut map)
        })?;
        let mut out = Vec::new();
        let result = (|| {
            // SAFETY: live agent, map and opt args.
            check("nixl_capi_get_notifs", unsafe {
                (api.get_notifs)(self.raw, map, self.opt)
            })?;
            let mut agents = 0usize;
            // SAFETY: a live map.
            check("nixl_capi_notif_map_size", unsafe {
                (api.notif_map_size)(map, &mut agents)
            })?;
            for i in 0..agents {
                let mut name: *const c_char = std::ptr::null();
                // SAFETY: `i` is below the map's size; the name lives with the map.
                check("nixl_capi_notif_map_get_agent_at", unsafe {
                    (api.notif_map_get_agent_at)(map, i, &mut name)
                })?;
                let mut n = 0usize;
                // SAFETY: a live map and one of its names.
                check("nixl_capi_notif_map_get_notifs_size", unsafe {
                    (api.notif_map_get_notifs_size)(map, name, &mut n)
                })?;
                // SAFETY: a NUL-terminated name owned by the map.
                let peer = unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned();
                for j in 0..n {
                    let (mut data, mut len): (*const c_void, usize) = (std::ptr::null(), 0);
                    // SAFETY: `j` is below that agent's count; the data lives with the map.
                    check("nixl_capi_notif_map_get_notif", unsafe {
                        (api.notif_map_get_notif)(map, name, j, &mut data, &mut len)
                    })?;
                    let bytes = if data.is_null() {
                        Vec::new()
                    } else {
                        // SAFETY: `len` bytes owned by the map, copied out.
                        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec()
                    };
                    out.push((peer.clone(), bytes));
                }
            }
            Ok(())
        })();
        // SAFETY: destroyed once.
        unsafe { (api.destroy_notif_map)(map) };
        result.map(|()| out)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let api = self.api;
        // SAFETY: each handle is live (or null) and destroyed once, the
        // backend and opt args before the agent that made them.
        unsafe {
            if !self.opt.is_null() {
                (api.destroy_opt_args)(self.opt);
            }
            if !self.backend.is_null() {
                let s = (api.destroy_backend)(self.backend);
                if s != SUCCESS {
                    tracing::debug!("nixl_capi_destroy_backend returned {s}");
                }
            }
            let s = (api.destroy_agent)(self.raw);
            if s != SUCCESS {
                tracing::warn!(
                    "nixl_capi_destroy_agent of `{}` returned {s} ({})",
                    self.name,
                    status_name(s)
                );
            }
        }
    }
}

/// Memory of a [`Region`] registered with an [`Agent`]; deregistered on drop.
#[derive(Debug)]
pub struct Registered<'r> {
    agent: &'r Agent,
    addr: usize,
    len: usize,
    _region: std::marker::PhantomData<&'r ()>,
}

impl Registered<'_> {
    /// The registered address.
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// The registered length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether nothing is registered (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.agent.deregister_unchecked(&[(self.addr, self.len)], 0) {
            tracing::warn!("deregistering {:#x}+{} from NIXL: {e}", self.addr, self.len);
        }
    }
}

/// Flush stdout and stderr and end the process with `code` at once
/// (`_exit`), without exit handlers: see [`crate::loaded`]. For a program
/// that has released everything of its own.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process; nothing of ours runs after it.
    unsafe { libc::_exit(code) }
}

/// Register pool memory for the registrar.
///
/// The registrar's registration lives inside a `Pool`, whose teardown
/// deregisters before it unmaps (`Pool::release`: registrations first), so
/// the memory outlives the registration.
pub(crate) fn register_pool_memory(agent: &Agent, addr: usize, len: usize) -> Result<(), Failure> {
    // SAFETY: as said above: `addr..addr+len` is part of a live pool mapping
    // that is deregistered (NixlRegistration::deregister) before it unmaps.
    unsafe { agent.register_unchecked(&[(addr, len)], 0) }
}
