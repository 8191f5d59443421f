//! The `nixl` registrar: registers a pool with a NIXL agent, the transfer
//! library vLLM, SGLang and Dynamo move KV cache with (UCX, libfabric, GDS
//! underneath), so an engine's peers on other nodes can READ and WRITE it.
//!
//! NIXL's C API (`libnixl_capi.so`, NIXL 1.5) is loaded at run time, so
//! nothing NIXL is needed to build; the PyPI wheel `nixl-cu12==1.5.1` ships
//! it. The library is, in order: `[nixl] lib`, `$HOSTPOOL_NIXL_LIB`,
//! `$NIXL_PREFIX/lib{/x86_64-linux-gnu,64,}/libnixl_capi.so`, the library
//! directory of an installed `nixl_cu12` / `nixl_cu13` Python package, and
//! last `libnixl_capi.so` through the loader's search path.
//!
//! ```toml
//! register = ["nixl"]
//! block_size = "2MiB"            # regions never split a block
//!
//! [nixl]
//! agent = "prefill-0"            # default hostpool-<host>-<pid>
//! backend = "UCX"                # default
//! backend_params = { num_workers = "2" }
//! max_region = "64GiB"           # split size; default the whole pool
//! listen_port = 5555             # serve this agent's metadata over TCP
//! progress_thread = true         # default; NIXL's thread polls a core away (see NixlOptions)
//! required = true                # default; false: skip (with the reason) without NIXL
//! ```
//!
//! Registration creates the agent and its backend, then registers the pool
//! as DRAM regions of at most `max_region` bytes whose boundaries fall on
//! `lcm(page, block)`, one call per region, all or nothing: when one fails,
//! the regions before it are deregistered last-first and the error names the
//! region. The report gives the agent, the backend, every region
//! `(addr, len, dev_id)` and the agent's metadata (its size and base64), which
//! a peer loads to reach the pool.

mod doctor;
mod sys;

use std::sync::Arc;
use std::time::Instant;

use pool_core::plugin::PinContext;
use pool_core::plugin::PinCost;
use pool_core::plugin::{Registrar, RegistrarPlugin, Registration};
use pool_core::{ByteSize, Error, Extent, Region, Result, TeardownIssue};
use pool_core::{format_bytes, mr_regions};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use sys::{Agent, Api, Failure, LoadError, Op, Registered, exit_now};

/// The plugin name, and the name of its config table.
pub const NAME: &str = "nixl";

/// The C API's file name.
pub const LIBRARY: &str = "libnixl_capi.so";

/// How to get NIXL, for error messages.
pub const INSTALL: &str = "install NIXL's wheel (`pip install --no-deps nixl-cu12==1.5.1`), or \
    point `[nixl] lib` or HOSTPOOL_NIXL_LIB at libnixl_capi.so (NIXL_PREFIX also works for a \
    source install)";

/// The `[nixl]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NixlOptions {
    /// Path of `libnixl_capi.so`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lib: Option<String>,
    /// The agent's name (default `hostpool-<host>-<pid>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The backend plugin (default `UCX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The backend's parameters, passed through over its defaults.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub backend_params: std::collections::BTreeMap<String, String>,
    /// The largest region registered at once (default: the whole pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_region: Option<ByteSize>,
    /// Serve this agent's metadata on this TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_port: Option<u16>,
    /// Give the agent NIXL's progress thread (default true). The thread
    /// polls without pause: a core for as long as the pool is held. Without
    /// it, transfers from peers progress only when the holder calls the
    /// agent (`hostpool alloc --hold` polls for notifications every 20 ms,
    /// and turns the thread off unless this key is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_thread: Option<bool>,
    /// Fail the pool when NIXL is not available (default); `false` skips
    /// the registration with the reason in the report, and a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
}

impl NixlOptions {
    fn validate(&self) -> Result<()> {
        if self.lib.as_deref() == Some("") {
            return Err(Error::config(
                "[nixl] lib is empty; give the path of libnixl_capi.so or leave the key out",
            ));
        }
        if let Some(a) = &self.agent
            && (a.is_empty() || a.contains('\0'))
        {
            return Err(Error::config("[nixl] agent must be a non-empty name"));
        }
        if self.backend.as_deref() == Some("") {
            return Err(Error::config(
                "[nixl] backend is empty; name a NIXL plugin such as UCX",
            ));
        }
        if self.max_region.is_some_and(|m| m.get() == 0) {
            return Err(Error::config(
                "[nixl] max_region is 0; give a size such as \"64GiB\", or leave it out",
            ));
        }
        if self.listen_port == Some(0) {
            return Err(Error::config(
                "[nixl] listen_port is 0; give a TCP port, or leave it out",
            ));
        }
        Ok(())
    }

    /// The agent name.
    pub fn agent_name(&self) -> String {
        self.agent.clone().unwrap_or_else(|| {
            let host = rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned();
            format!("hostpool-{host}-{}", std::process::id())
        })
    }

    /// The backend.
    pub fn backend(&self) -> &str {
        self.backend.as_deref().unwrap_or("UCX")
    }
}

/// Where `libnixl_capi.so` is, and how it was found.
///
/// # Errors
/// None today; a missing file shows when it is loaded.
pub fn library(options: &NixlOptions) -> (String, &'static str) {
    if let Some(lib) = &options.lib {
        return (lib.clone(), "[nixl] lib");
    }
    if let Some(lib) = std::env::var_os("HOSTPOOL_NIXL_LIB").filter(|v| !v.is_empty()) {
        return (lib.to_string_lossy().into_owned(), "HOSTPOOL_NIXL_LIB");
    }
    if let Some(prefix) = std::env::var_os("NIXL_PREFIX").filter(|v| !v.is_empty()) {
        let prefix = std::path::PathBuf::from(prefix);
        for dir in ["lib/x86_64-linux-gnu", "lib64", "lib"] {
            let p = prefix.join(dir).join(LIBRARY);
            if p.exists() {
                return (p.to_string_lossy().into_owned(), "NIXL_PREFIX");
            }
        }
    }
    if let Some(p) = python_package_library() {
        return (p, "the nixl Python package");
    }
    (LIBRARY.to_string(), "the loader's search path")
}

/// `libnixl_capi.so` of an installed `nixl_cu12` or `nixl_cu13` wheel, in
/// the active virtual environment, the user's site, or the system's.
fn python_package_library() -> Option<String> {
    let mut roots: Vec<std::path::PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(v.into());
    }
    if let Some(h) = std::env::var_os("HOME") {
        roots.push(std::path::PathBuf::from(h).join(".local"));
    }
    roots.extend(["/usr/local", "/usr"].map(std::path::PathBuf::from));
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join("lib")) else {
            continue;
        };
        for python in entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        {
            for site in ["site-packages", "dist-packages"] {
                for pkg in ["nixl_cu12", "nixl_cu13"] {
                    let p = python
                        .path()
                        .join(site)
                        .join(format!(".{pkg}.mesonpy.libs"))
                        .join(LIBRARY);
                    if p.exists() {
                        return Some(p.to_string_lossy().into_owned());
                    }
                }
            }
        }
    }
    None
}

/// NIXL's version, when the library is a wheel's (`Version:` of the
/// `nixl_cu12-*.dist-info` next to its `.nixl_cu12.mesonpy.libs`); `None`
/// for a source build, whose C API says no version.
pub fn version(library: &str) -> Option<String> {
    let dir = std::path::Path::new(library).parent()?;
    let pkg = dir
        .file_name()?
        .to_str()?
        .strip_prefix('.')?
        .strip_suffix(".mesonpy.libs")?;
    let site = dir.parent()?;
    std::fs::read_dir(site).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(&format!("{pkg}-")) && name.ends_with(".dist-info")) {
            return None;
        }
        let meta = std::fs::read_to_string(e.path().join("METADATA")).ok()?;
        meta.lines()
            .find_map(|l| l.strip_prefix("Version: "))
            .map(|v| format!("{pkg} {}", v.trim()))
    })
}

/// Load the C API of `options`.
///
/// # Errors
/// [`Error::NotAvailable`] naming the library, how it was found, and the remedy.
pub fn load(options: &NixlOptions) -> Result<(&'static sys::Api, String)> {
    let (path, source) = library(options);
    match sys::Api::load(&path) {
        Ok(api) => Ok((api, path)),
        Err(e) => Err(Error::NotAvailable {
            what: format!("the {NAME} registrar"),
            reason: match e {
                sys::LoadError::Open(e) => {
                    format!("cannot load {path} (from {source}): {e}; {INSTALL}")
                }
                sys::LoadError::Symbol(name, e) => format!(
                    "{path} (from {source}) lacks {name} ({e}): it is not NIXL 1.5's C API; {INSTALL}"
                ),
                sys::LoadError::Stub => format!(
                    "{path} (from {source}) is a stub: nixl_capi_is_stub() says it was built without \
                     NIXL; {INSTALL}"
                ),
            },
        }),
    }
}

/// The `nixl` registrar, configured.
#[derive(Debug, Clone)]
pub struct NixlRegistrar {
    options: NixlOptions,
}

impl NixlRegistrar {
    /// A registrar with these options.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty name, zero size or port.
    pub fn new(options: NixlOptions) -> Result<NixlRegistrar> {
        options.validate()?;
        Ok(NixlRegistrar { options })
    }
}

fn build(table: Option<&Value>) -> Result<Box<dyn Registrar>> {
    Ok(Box::new(NixlRegistrar::new(
        pool_core::plugin::parse_table(NAME, table)?,
    )?))
}

inventory::submit! {
    RegistrarPlugin::new(
        NAME,
        "a NIXL agent (UCX, libfabric, ...) through NIXL's C API, loaded at run time: DRAM \
         regions split at max_region on block boundaries, with the agent's metadata for peers; \
         [nixl] lib, agent, backend, backend_params, max_region, listen_port, progress_thread, required",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_cost(PinCost::new(pool_core::plugin::REGISTER_SECONDS_PER_PAGE, false))
    .with_doctor(doctor::findings)
}

/// Whether this process loaded NIXL. The `nixl-cu12` 1.5.1 wheel's UCX
/// InfiniBand module crashes in `exit()` (a `libnl-route` destructor) on
/// hosts where libibverbs is installed; a program that loaded NIXL ends with
/// `_exit` after flushing its output (the `hostpool` CLI does), or runs with
/// `UCX_MODULES=^ib` where there is no RDMA NIC.
pub fn loaded() -> bool {
    sys::Api::any_loaded()
}

/// The regions a pool of `mapped` bytes is registered as.
///
/// # Errors
/// [`Error::Layout`] for a block the layout cannot honour.
pub fn regions(
    mapped: u64,
    page: pool_core::PageSize,
    block: u64,
    max_region: Option<u64>,
) -> Result<Vec<Extent>> {
    Ok(mr_regions(
        mapped,
        page,
        block,
        max_region.unwrap_or(mapped.max(1)),
    )?)
}

impl Registrar for NixlRegistrar {
    fn name(&self) -> &'static str {
        NAME
    }

    fn plan(&self, size: pool_core::MappedSize, ctx: &PinContext) -> Value {
        let block = ctx.block(size.page());
        let (lib, source) = library(&self.options);
        match regions(
            size.mapped(),
            size.page(),
            block,
            self.options.max_region.map(ByteSize::get),
        ) {
            Ok(r) => json!({
                "library": lib,
                "library_from": source,
                "agent": self.options.agent_name(),
                "backend": self.options.backend(),
                "block": block,
                "regions": r.iter().map(|e| json!({"offset": e.offset, "len": e.len})).collect::<Vec<_>>(),
            }),
            Err(e) => json!({ "error": e.to_string() }),
        }
    }

    fn register(&self, region: Region<'_>, ctx: &PinContext) -> Result<Box<dyn Registration>> {
        let started = Instant::now();
        let page = region.page();
        let block = ctx.block(page);
        let extents = regions(
            region.mapped_len(),
            page,
            block,
            self.options.max_region.map(ByteSize::get),
        )?;
        let (api, path) = match load(&self.options) {
            Ok(loaded) => loaded,
            Err(e @ Error::NotAvailable { .. }) if self.options.required == Some(false) => {
                tracing::warn!("{NAME} registration skipped ([nixl] required = false): {e}");
                return Ok(Box::new(Skipped {
                    reason: e.to_string(),
                }));
            }
            Err(e) => return Err(e),
        };
        let name = self.options.agent_name();
        let params: Vec<(String, String)> = self
            .options
            .backend_params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let backend = self.options.backend();
        let agent = Agent::new(api, &name, self.options.listen_port, self.options.progress_thread.unwrap_or(true), backend, &params).map_err(|f| Error::Plugin {
            what: format!("{NAME} registrar"),
            message: format!(
                "cannot create agent `{name}` with backend {backend}: {f}; check that NIXL finds its \
                 plugins (NIXL_PLUGIN_DIR) and the backend's parameters"
            ),
            source: Some(Box::new(f)),
        })?;
        let mut done: Vec<(usize, usize)> = Vec::with_capacity(extents.len());
        for (i, e) in extents.iter().enumerate() {
            let (ptr, len) = region.range(*e).map_err(|err| {
                Error::os("nixl region", err, pool_core::Context::new(e.len, page))
            })?;
            // The pool deregisters (teardown runs registrations first)
            // before it unmaps: the contract of `register_pool_memory`.
            if let Err(f) = sys::register_pool_memory(&agent, ptr as usize, len) {
                let undone = roll_back(&agent, &mut done);
                return Err(Error::Plugin {
                    what: format!("{NAME} registrar"),
                    message: format!(
                        "registering region {i} of {} (offset {}, {}) at {:#x} with agent `{name}` ({backend}) \
                         failed: {f}; {undone}",
                        extents.len(),
                        format_bytes(e.offset),
                        format_bytes(e.len),
                        ptr as usize,
                    ),
                    source: Some(Box::new(f)),
                });
            }
            done.push((ptr as usize, len));
        }
        let metadata = agent.local_metadata().map_err(|f| {
            let undone = roll_back(&agent, &mut done);
            Error::Plugin {
                what: format!("{NAME} registrar"),
                message: format!("cannot read agent `{name}`'s metadata: {f}; {undone}"),
                source: Some(Box::new(f)),
            }
        })?;
        let details = json!({
            "status": "registered",
            "library": path,
            "agent": name,
            "backend": backend,
            "block_size": block,
            "listen_port": self.options.listen_port,
            "progress_thread": self.options.progress_thread.unwrap_or(true),
            "seconds": started.elapsed().as_secs_f64(),
            "regions": done.iter().map(|&(a, l)| json!({"addr": format!("{a:#x}"), "addr_u64": a, "len": l, "dev_id": 0})).collect::<Vec<_>>(),
            "metadata": { "bytes": metadata.len(), "base64": base64(&metadata) },
        });
        let agent = Arc::new(agent);
        AGENTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, Arc::downgrade(&agent)));
        Ok(Box::new(NixlRegistration {
            agent,
            regions: done,
            details,
        }))
    }
}

/// Deregister `done` last-first; says what was undone.
fn roll_back(agent: &Agent, done: &mut Vec<(usize, usize)>) -> String {
    let n = done.len();
    let mut failed = Vec::new();
    while let Some((addr, len)) = done.pop() {
        if let Err(f) = agent.deregister_unchecked(&[(addr, len)], 0) {
            failed.push(format!("{addr:#x}+{len}: {f}"));
        }
    }
    match (n, failed.is_empty()) {
        (0, _) => "nothing had been registered".to_string(),
        (n, true) => format!("the {n} region(s) before it were deregistered in reverse"),
        (_, false) => format!("could not deregister {}", failed.join("; ")),
    }
}

/// A best-effort registration that did not happen.
#[derive(Debug)]
struct Skipped {
    reason: String,
}

impl Registration for Skipped {
    fn details(&self) -> Value {
        json!({ "status": "skipped", "reason": self.reason })
    }
    fn deregister(self: Box<Self>) -> Vec<TeardownIssue> {
        Vec::new()
    }
}

/// The agents of this process's live registrations, by name.
static AGENTS: std::sync::Mutex<Vec<(String, std::sync::Weak<Agent>)>> =
    std::sync::Mutex::new(Vec::new());

/// The agent a live registration of this process created, by its name (the
/// report's `agent`): for the embedder that serves the pool, to read the
/// notifications its peers send, or to start transfers itself.
pub fn agent(name: &str) -> Option<Arc<Agent>> {
    let mut agents = AGENTS.lock().unwrap_or_else(|p| p.into_inner());
    agents.retain(|(_, w)| w.strong_count() > 0);
    agents
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, w)| w.upgrade())
}

/// A live registration: the agent and its regions.
#[derive(Debug)]
struct NixlRegistration {
    agent: Arc<Agent>,
    regions: Vec<(usize, usize)>,
    details: Value,
}

impl Registration for NixlRegistration {
    fn details(&self) -> Value {
        self.details.clone()
    }

    fn deregister(mut self: Box<Self>) -> Vec<TeardownIssue> {
        let mut issues = Vec::new();
        while let Some((addr, len)) = self.regions.pop() {
            if let Err(f) = self.agent.deregister_unchecked(&[(addr, len)], 0) {
                issues.push(TeardownIssue::log(
                    "nixl deregister",
                    format!("{addr:#x}+{len} from agent `{}`: {f}", self.agent.name()),
                ));
            }
        }
        issues
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decode standard base64 (padding optional); `None` for anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim().trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = B64.iter().position(|&b| b == c)?;
        acc = (acc << 6) | u32::try_from(v).ok()?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).ok()?);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0, 255, 128, 7],
        ] {
            assert_eq!(base64_decode(&base64(data)).as_deref(), Some(data));
        }
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64_decode("not base64!"), None);
    }

    #[test]
    fn regions_split_at_max_region_on_block_boundaries() {
        let page = pool_core::PageSize::BASE_4K;
        let r = regions(10 << 20, page, 1 << 20, Some(3 << 20 | 12345)).unwrap();
        assert_eq!(r.iter().map(|e| e.len).sum::<u64>(), 10 << 20);
        assert!(
            r.iter()
                .all(|e| e.offset % (1 << 20) == 0 && e.len <= 3 << 20 | 12345)
        );
        assert_eq!(regions(10 << 20, page, 1 << 20, None).unwrap().len(), 1);
        // A block larger than max_region cannot be honoured.
        assert!(regions(10 << 20, page, 4 << 20, Some(3 << 20)).is_err());
    }

    #[test]
    fn the_version_is_read_from_the_wheels_metadata() {
        let site = std::env::temp_dir().join(format!("nixl-version-{}", std::process::id()));
        let libs = site.join(".nixl_cu12.mesonpy.libs");
        let info = site.join("nixl_cu12-1.5.1.dist-info");
        std::fs::create_dir_all(&libs).unwrap();
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("METADATA"),
            "Metadata-Version: 2.1\nName: nixl-cu12\nVersion: 1.5.1\n",
        )
        .unwrap();
        let lib = libs.join(LIBRARY);
        assert_eq!(
            version(lib.to_str().unwrap()).as_deref(),
            Some("nixl_cu12 1.5.1")
        );
        assert_eq!(version("/usr/local/nixl/lib/libnixl_capi.so"), None);
        std::fs::remove_dir_all(&site).unwrap();
    }

    #[test]
    fn bad_options_are_config_errors() {
        for bad in [
            NixlOptions {
                lib: Some(String::new()),
                ..Default::default()
            },
            NixlOptions {
                agent: Some(String::new()),
                ..Default::default()
            },
            NixlOptions {
                max_region: Some(ByteSize(0)),
                ..Default::default()
            },
            NixlOptions {
                listen_port: Some(0),
                ..Default::default()
            },
        ] {
            assert!(matches!(NixlRegistrar::new(bad), Err(Error::Config { .. })));
        }
        let e = pool_core::plugin::parse_table::<NixlOptions>(NAME, Some(&json!({"agnet": "x"})))
            .unwrap_err();
        assert!(e.to_string().contains("agnet"), "{e}");
    }
}
