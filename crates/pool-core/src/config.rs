//! Pool configuration, read from TOML or JSON.
//!
//! The pool's own settings are top-level keys; each plugin's settings live in
//! a table named after the plugin and are parsed by that plugin alone:
//!
//! ```toml
//! size = "384GiB"
//! backing = "anon"
//! threads = 16
//!
//! [anon]
//! thp = true
//! ```
//!
//! Unknown keys are errors everywhere: a top-level key that is neither a pool
//! setting nor the table of a registered plugin is rejected, and each plugin
//! parses its table with `deny_unknown_fields`.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::size::ByteSize;

/// The top-level keys that are pool settings; every other top-level table
/// belongs to a plugin. Kept in step with [`PoolConfig`] by a test.
pub const POOL_KEYS: &[&str] = &[
    "size",
    "backing",
    "dir",
    "page_size",
    "threads",
    "prefault",
    "block_size",
    "pin",
    "register",
    "sharing",
    "numa_node",
    "lease",
    "huge_pages",
];

/// Keys that moved, and where to: an operator's file that still has one is
/// told the new place, never ignored.
pub const MOVED_KEYS: &[(&str, &str)] = &[
    ("keeper", "keeper"),
    ("keeper_tag", "tag"),
    ("keeper_fallback", "fallback"),
    ("keeper_attach_timeout_secs", "attach_timeout_secs"),
    ("keeper_companion_of", "companion_of"),
];

/// How pages are faulted in before the pool is handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefaultChoice {
    /// `populate-write` where the kernel has it, else `touch`.
    #[default]
    Auto,
    /// `madvise(MADV_POPULATE_WRITE)`: the kernel's own path; fails if absent.
    PopulateWrite,
    /// A read-modify-write of one byte per page.
    Touch,
    /// Leave pages to fault on first use (not recommended for a GPU pool:
    /// the driver then faults them serially under a global lock).
    None,
}

crate::choice!(PrefaultChoice, "prefault method", {
    Auto => "auto", "populate-write where the kernel has it, else touch",
    PopulateWrite => "populate-write", "madvise(MADV_POPULATE_WRITE): the kernel's own path",
    Touch => "touch", "one read-modify-write per page",
    None => "none", "no prefault: pages fault on first use",
});

/// Pinning: which pinner, and whether a failure fails the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinConfig {
    /// The pinner's name; `None` for no pinning, written `"off"` in config
    /// files and reports.
    #[serde(default, with = "pin_kind")]
    pub kind: Option<String>,
    /// Fail the pool when pinning fails (otherwise warn and leave it pageable).
    #[serde(default)]
    pub required: bool,
    /// Check the memlock bound before pinning (`check`), or not (`ignore`).
    #[serde(default)]
    pub memlock_bound: crate::host::memlock::MemlockPolicy,
    /// Pin the whole pool (`pool`), or in a shared pool only this rank's shard (`shard`).
    #[serde(default)]
    pub scope: PinScope,
    /// Pin on a background thread: the pool is usable once prefaulted (and,
    /// shared, past the barrier), and pinned chunk by chunk in address order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
    /// The chunk a background pin takes at a time (default 256 MiB, rounded
    /// down to whole blocks and pages, never below one): a transfer waiting
    /// for a range waits at most one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_chunk: Option<crate::ByteSize>,
}

/// What a pinner pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PinScope {
    /// The whole pool.
    #[default]
    Pool,
    /// This rank's shard of a shared pool (the whole pool when private).
    Shard,
}

crate::choice!(PinScope, "pin scope", {
    Pool => "pool", "the whole pool",
    Shard => "shard", "this rank's shard of a shared pool",
});

/// What config files and reports call no pinner.
pub const PIN_OFF: &str = "off";

/// `pin.kind` as config files write it: a pinner's name, or `"off"` (or
/// nothing) for none.
mod pin_kind {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(kind: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.as_deref().unwrap_or(super::PIN_OFF))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Ok(super::pin_kind_from(String::deserialize(d)?))
    }
}

/// A pinner's name, with `"off"` and `""` meaning none.
pub fn pin_kind_from(name: impl Into<String>) -> Option<String> {
    let name = name.into();
    (name != PIN_OFF && !name.is_empty()).then_some(name)
}

impl Default for PinConfig {
    fn default() -> Self {
        PinConfig {
            kind: None,
            required: false,
            memlock_bound: crate::host::memlock::MemlockPolicy::Check,
            scope: PinScope::Pool,
            background: false,
            background_chunk: None,
        }
    }
}

impl PinConfig {
    /// Whether a pinner was asked for.
    pub fn is_on(&self) -> bool {
        self.kind.is_some()
    }

    /// The pinner's name, or `"off"`, as reports write it.
    pub fn kind_name(&self) -> &str {
        self.kind.as_deref().unwrap_or(PIN_OFF)
    }
}

/// A pool shared by the ranks of one engine on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharingConfig {
    /// The pool's name, the same for every rank: letters, digits, `.`, `_`, `-`.
    pub name: String,
    /// How many ranks share it.
    pub world: u32,
    /// This rank, `0..world`.
    pub rank: u32,
    /// Seconds a rank waits for the creator, and for ranks that never attach.
    #[serde(default = "default_attach_timeout")]
    pub attach_timeout_secs: f64,
    /// Seconds a rank waits at the barrier for ranks that attached but have
    /// not arrived (stopped, hung, or still prefaulting a very large shard).
    #[serde(default = "default_barrier_timeout")]
    pub barrier_timeout_secs: f64,
    /// How the ranks meet: `socket` (default; nothing in any directory,
    /// ranks in one network namespace) or `file` (a control file in
    /// `control_dir`, for ranks that share only a directory).
    #[serde(default)]
    pub rendezvous: Rendezvous,
    /// Where control files live (default `/dev/shm`); a tmpfs all ranks see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_dir: Option<PathBuf>,
}

/// A pool's name, which names its socket (and, with the file rendezvous,
/// its files): 1 to 64 letters, digits, `.`, `_` or `-`, not starting with
/// `.`. `what` names it in the error ("shared pool", "kept pool").
///
/// # Errors
/// [`Error::Config`] saying what a name may be.
pub fn check_name(what: &str, n: &str) -> Result<()> {
    let fine = !n.is_empty()
        && n.len() <= 64
        && !n.starts_with('.')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if fine {
        return Ok(());
    }
    Err(Error::config(format!(
        "{what} name `{n}` must be 1 to 64 letters, digits, `.`, `_` or `-`, not starting with `.`"
    )))
}

/// Most ranks one shared pool can have.
pub const MAX_WORLD: u32 = 256;
/// Most files (segments) one shared pool can have.
pub const MAX_FILES: usize = 1024;

/// The longest tag an engine may store with its lease (`lease.tag`): a
/// hash or a short description of what its offloaded bytes are for.
pub const MAX_KEEPER_TAG_BYTES: usize = 16 << 10;

/// A lease of a kept pool: the `[lease]` table. The one place a lease's
/// settings are read and checked ([`LeaseConfig::validate`], which the plan
/// runs); the CLI's flags and the Python package's keywords fill it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LeaseConfig {
    /// The kept pool's name (`hostpool keep --name NAME`): the pool is
    /// leased from its keeper instead of built; the memory comes resident,
    /// this process maps, pins and registers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeper: Option<String>,
    /// A tag this engine stores with its lease, handed to the next lease
    /// (say, a hash of the model config its offloaded KV cache is for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// What to do when no keeper answers: fail (default) or build a pool of
    /// this process's own.
    #[serde(default)]
    pub fallback: KeeperFallback,
    /// How long a lease waits for the keeper to hand the pool over (it may
    /// be clearing it after the previous lease); unset, a shared pool's
    /// attach timeout, else [`DEFAULT_ATTACH_TIMEOUT_SECS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_timeout_secs: Option<f64>,
    /// Map the lease this engine's ranks hold, as a process of the engine
    /// that is none of its ranks (vLLM's scheduler, which keeps the kept
    /// pool's index): no rank, no barrier, no generation of its own. The
    /// keeper refuses it unless a lease of this engine is in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub companion_of: Option<String>,
    /// The size this engine expects of the kept pool, when it named one
    /// (the pool's `size`, given as a key, a flag or a keyword): the keeper
    /// refuses a pool of another size. `None`: any size.
    #[serde(skip)]
    pub size: Option<ByteSize>,
}

impl LeaseConfig {
    /// A lease of the pool `keeper` keeps, with every other setting at its
    /// default.
    pub fn of(keeper: impl Into<String>) -> LeaseConfig {
        LeaseConfig {
            keeper: Some(keeper.into()),
            ..LeaseConfig::default()
        }
    }

    /// How long the lease waits for its keeper: `attach_timeout_secs`,
    /// else the ranks' attach timeout, else the default.
    pub fn attach_timeout(&self, sharing: Option<&SharingConfig>) -> f64 {
        self.attach_timeout_secs
            .or(sharing.map(|s| s.attach_timeout_secs))
            .unwrap_or(DEFAULT_ATTACH_TIMEOUT_SECS)
    }

    /// Check the lease: a keeper named as a keeper names it, a tag it can
    /// store, a timeout it can wait, and a companion that is none of the
    /// engine's ranks (`sharing` is the pool's). The one check of a lease,
    /// whoever filled the table (a config file, the CLI's flags, the Python
    /// package's keywords, which each name in the message).
    ///
    /// # Errors
    /// [`Error::Config`] naming the key and what to give instead.
    pub fn validate(&self, sharing: Option<&SharingConfig>) -> Result<&str> {
        let Some(keeper) = &self.keeper else {
            let given = [
                self.tag.is_some().then_some("tag"),
                (self.fallback != KeeperFallback::Fail).then_some("fallback"),
                self.attach_timeout_secs
                    .is_some()
                    .then_some("attach_timeout_secs"),
                self.companion_of.is_some().then_some("companion_of"),
            ];
            let key = given.into_iter().flatten().next().unwrap_or("a setting");
            return Err(Error::config(format!(
                "{} is given but no keeper {}: name the kept pool to lease, or drop `{key}`",
                lease_key(key),
                lease_key("keeper")
            )));
        };
        check_name("lease.keeper", keeper)?;
        if let Some(engine) = &self.companion_of {
            check_name("lease.companion_of", engine)?;
            let ranked = [
                sharing.is_some().then_some("sharing"),
                self.tag.is_some().then_some("lease.tag"),
                (self.fallback != KeeperFallback::Fail).then_some("lease.fallback"),
            ];
            if let Some(key) = ranked.into_iter().flatten().next() {
                return Err(Error::config(format!(
                    "`{key}` is for an engine's ranks; a companion (`lease.companion_of = \
                     \"{engine}\"`) maps the lease they hold and is none of them: drop `{key}`"
                )));
            }
        }
        if let Some(tag) = &self.tag
            && tag.len() > MAX_KEEPER_TAG_BYTES
        {
            return Err(Error::config(format!(
                "{} is {} bytes; a lease stores at most {MAX_KEEPER_TAG_BYTES} (store a hash of \
                 what the offloaded bytes are for, not the thing itself)",
                lease_key("tag"),
                tag.len()
            )));
        }
        if let Some(t) = self.attach_timeout_secs
            && !(t.is_finite() && t > 0.0 && t <= MAX_ATTACH_TIMEOUT_SECS)
        {
            return Err(Error::config(format!(
                "{} = {t} s must be a positive number of seconds, at most one day \
                 ({MAX_ATTACH_TIMEOUT_SECS} s)",
                lease_key("attach_timeout_secs")
            )));
        }
        Ok(keeper)
    }
}

/// A key of the `[lease]` table as each front end spells it: the config
/// file's, the CLI's flag and the Python keyword, where they have one.
fn lease_key(key: &str) -> String {
    let (flag, keyword) = match key {
        "keeper" => ("--keeper", "keeper="),
        "tag" => ("--keeper-tag", "keeper_tag="),
        "fallback" => ("--keeper-fallback", "keeper_fallback="),
        "attach_timeout_secs" => ("--attach-timeout", "keeper_attach_timeout="),
        _ => return format!("`lease.{key}`"),
    };
    format!("`lease.{key}` ({flag}, Python {keyword})")
}

/// The default attach timeout: how long a rank waits for the creator, and
/// for ranks that never attach.
pub const DEFAULT_ATTACH_TIMEOUT_SECS: f64 = 30.0;

fn default_attach_timeout() -> f64 {
    DEFAULT_ATTACH_TIMEOUT_SECS
}

/// How the ranks of a shared pool meet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rendezvous {
    /// A unix socket in the abstract namespace; the memory is passed as file
    /// descriptors and never has a name in any directory.
    #[default]
    Socket,
    /// A control file and named data files in a directory all ranks see.
    File,
}

crate::choice!(Rendezvous, "rendezvous", {
    Socket => "socket", "a unix socket in the abstract namespace (ranks of one network namespace)",
    File => "file", "a control file in the control directory (ranks that share a directory)",
});

/// The default barrier timeout: ten minutes, enough to prefault hundreds of
/// GiB of 4 KiB pages per rank.
pub const DEFAULT_BARRIER_TIMEOUT_SECS: f64 = 600.0;

fn default_barrier_timeout() -> f64 {
    DEFAULT_BARRIER_TIMEOUT_SECS
}

impl SharingConfig {
    /// Check name, world, rank and timeout.
    ///
    /// # Errors
    /// [`Error::Config`] saying which and how to fix it.
    pub fn validate(&self) -> Result<()> {
        check_name("shared pool", &self.name)?;
        if self.world == 0 || self.world > MAX_WORLD {
            return Err(Error::config(format!(
                "world {} must be between 1 and {}",
                self.world, MAX_WORLD
            )));
        }
        if self.rank >= self.world {
            return Err(Error::config(format!(
                "rank {} must be below world {} (ranks are 0 to {})",
                self.rank,
                self.world,
                self.world - 1
            )));
        }
        if !(self.attach_timeout_secs.is_finite() && self.attach_timeout_secs > 0.0) {
            return Err(Error::config(format!(
                "attach timeout {} s must be a positive number of seconds",
                self.attach_timeout_secs
            )));
        }
        if !(self.barrier_timeout_secs.is_finite()
            && self.barrier_timeout_secs > 0.0
            && self.barrier_timeout_secs <= MAX_ATTACH_TIMEOUT_SECS)
        {
            return Err(Error::config(format!(
                "barrier timeout {} s must be a positive number of seconds, at most one day \
                 ({MAX_ATTACH_TIMEOUT_SECS} s)",
                self.barrier_timeout_secs
            )));
        }
        if self.attach_timeout_secs > MAX_ATTACH_TIMEOUT_SECS {
            return Err(Error::config(format!(
                "attach timeout {} s is more than one day ({MAX_ATTACH_TIMEOUT_SECS} s), the \
                 longest a rank waits for its peers; give at most {MAX_ATTACH_TIMEOUT_SECS}",
                self.attach_timeout_secs
            )));
        }
        Ok(())
    }
}

/// The longest attach timeout: one day. Beyond it a rank that waits is a
/// rank that hangs, and `Duration::from_secs_f64` would overflow past
/// 1.8e19 s.
pub const MAX_ATTACH_TIMEOUT_SECS: f64 = 86_400.0;

/// Everything that describes one pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Bytes the caller needs (the logical size); mapped size is rounded up to the page.
    #[serde(default = "default_size")]
    pub size: ByteSize,
    /// Backing plugin name, or `auto` (no `dir`: `anon`; `dir` on hugetlbfs:
    /// `hugetlbfs`; `dir` on tmpfs: `shm-segmented`).
    #[serde(default = "auto")]
    pub backing: String,
    /// Directory for file-backed pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Page size the backing must use (for example 2MiB or 1GiB on hugetlbfs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<ByteSize>,
    /// Prefault threads (default: available cores, at least 64 MiB each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<NonZeroUsize>,
    /// Prefault method.
    #[serde(default)]
    pub prefault: PrefaultChoice,
    /// The caller's block size, any positive number of bytes (an engine's copy
    /// unit, such as vLLM's 61 × 512 B): registration chunks are cut on
    /// multiples of `lcm(block_size, page size)`, so they never split a block;
    /// that unit must fit in the pool (checked at plan time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<ByteSize>,
    /// Pinning policy.
    #[serde(default)]
    pub pin: PinConfig,
    /// Registrars to register the pool with, in order.
    #[serde(default)]
    pub register: Vec<String>,
    /// Share the pool between the ranks of one engine (default: private).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<SharingConfig>,
    /// Bind the pool's pages to a NUMA node: a number, `"gpu"` (the node of
    /// the GPU this process drives), or in a shared pool one node per rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<NumaNode>,
    /// Lease the pool from a keeper (`hostpool keep`) instead of building
    /// it: the `[lease]` table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseConfig>,
    /// Huge pages with `backing = "auto"`: required, prefer (fall back to
    /// 4 KiB pages when they run short, and say so) or off; unset, the
    /// backing `auto` picks from `dir` decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<HugePages>,
    /// Plugin tables by plugin name, each parsed by its plugin.
    #[serde(skip)]
    pub plugins: BTreeMap<String, Value>,
}

/// Whether a pool (with `backing = "auto"`) gets huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePages {
    /// Huge pages or nothing: a shortage is the capacity error.
    Required,
    /// Huge pages while they last: when they cannot hold the pool, 4 KiB
    /// pages instead, said in the report and the plan.
    Prefer,
    /// Never huge pages.
    Off,
}

crate::choice!(HugePages, "huge page policy", {
    Required => "required", "huge pages or nothing: a shortage is the capacity error",
    Prefer => "prefer", "huge pages while they last, else 4 KiB pages (said in the report)",
    Off => "off", "never huge pages",
});

/// Where a pool's pages go (`numa_node`): written as a node number, `"gpu"`,
/// or a list of one node per rank (`[0, 0, 1, 1]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NumaNode {
    /// This node.
    Node(u32),
    /// The node of the GPU this process drives (`[cuda] device`), from its
    /// PCI address in sysfs; in a shared pool each rank's shard goes to its
    /// own GPU's node.
    Gpu,
    /// One node per rank of a shared pool, in rank order.
    PerRank(Vec<u32>),
}

impl NumaNode {
    /// The node, when it is one number (what a plan resolves the others
    /// to).
    pub fn node(&self) -> Option<u32> {
        match self {
            NumaNode::Node(n) => Some(*n),
            _ => None,
        }
    }

    /// Read a node as people write it on a command line: `1`, `gpu`, or
    /// one node per rank, `0,0,1,1`.
    ///
    /// # Errors
    /// [`Error::Config`] saying which forms there are.
    pub fn parse(s: &str) -> Result<NumaNode> {
        let s = s.trim();
        let bad = || {
            Error::config(format!(
                "numa_node {s:?} is not a node: give a node number (0), \"gpu\" (the node of \
                 the pool's GPU) or, for a shared pool, one node per rank (0,0,1,1)"
            ))
        };
        let number = |n: &str| -> Result<u32> {
            let n = n.trim();
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            n.parse::<u32>().map_err(|_| bad())
        };
        if s.eq_ignore_ascii_case("gpu") {
            return Ok(NumaNode::Gpu);
        }
        if s.contains(',') {
            let nodes = s.split(',').map(number).collect::<Result<Vec<_>>>()?;
            return Ok(NumaNode::PerRank(nodes));
        }
        number(s).map(NumaNode::Node)
    }
}

impl std::fmt::Display for NumaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NumaNode::Node(n) => write!(f, "{n}"),
            NumaNode::Gpu => f.write_str("gpu"),
            NumaNode::PerRank(v) => {
                let v: Vec<String> = v.iter().map(u32::to_string).collect();
                write!(f, "[{}]", v.join(", "))
            }
        }
    }
}

impl Serialize for NumaNode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            NumaNode::Node(n) => s.serialize_u32(*n),
            NumaNode::Gpu => s.serialize_str("gpu"),
            NumaNode::PerRank(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for NumaNode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
            List(Vec<i64>),
        }
        let expect = "a node number (0), \"gpu\", or a list of one node per rank ([0, 0, 1, 1])";
        let node = |n: i64| {
            u32::try_from(n).map_err(|_| {
                D::Error::custom(format!("numa_node {n} is not a node number; give {expect}"))
            })
        };
        match Raw::deserialize(d)
            .map_err(|_| D::Error::custom(format!("numa_node must be {expect}")))?
        {
            Raw::Int(n) => node(n).map(NumaNode::Node),
            Raw::Text(t) if t.eq_ignore_ascii_case("gpu") => Ok(NumaNode::Gpu),
            Raw::Text(t) => Err(D::Error::custom(format!(
                "numa_node {t:?} is not a node; give {expect}"
            ))),
            Raw::List(v) => v
                .into_iter()
                .map(node)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(NumaNode::PerRank),
        }
    }
}

/// What an engine whose keeper does not answer does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeeperFallback {
    /// Fail, naming the keeper's socket and how to start it.
    #[default]
    Fail,
    /// Build a pool of its own, as without a keeper (the report says why).
    Build,
}

crate::choice!(KeeperFallback, "keeper fallback", {
    Fail => "fail", "fail, naming the keeper's socket and how to start it",
    Build => "build", "build a pool of this process's own, as without a keeper",
});

fn default_size() -> ByteSize {
    ByteSize::gib(1)
}

fn auto() -> String {
    "auto".to_string()
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: default_size(),
            backing: auto(),
            dir: None,
            page_size: None,
            threads: None,
            prefault: PrefaultChoice::Auto,
            block_size: None,
            pin: PinConfig::default(),
            register: Vec::new(),
            sharing: None,
            numa_node: None,
            lease: None,
            huge_pages: None,
            plugins: BTreeMap::new(),
        }
    }
}

/// The formats a config file can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// TOML.
    Toml,
    /// JSON.
    Json,
}

/// The largest config file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl PoolConfig {
    /// Read a config file; `.json` is JSON, `.toml` is TOML, anything else is
    /// JSON when it starts with `{` and TOML otherwise.
    ///
    /// # Errors
    /// [`Error::Config`] naming the file for a missing file, syntax errors
    /// and unknown or mistyped keys; [`Error::Os`] when reading it fails
    /// otherwise (`EACCES`, `EIO`).
    pub fn from_path(path: &Path) -> Result<PoolConfig> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            // A config is a few lines: read at most one byte past the
            // limit, so `--config /dev/zero` is an error, not an OOM kill.
            .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
            .map_err(|e| {
                Error::on_input_path(
                    "read",
                    path,
                    e,
                    format!("cannot read config file {}", path.display()),
                    "check the path given to --config (a UTF-8 TOML or JSON file)",
                )
            })?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(Error::config(format!(
                "config file {} is larger than {}: it is not a pool config; check the path given \
                 to --config",
                path.display(),
                crate::layout::format_bytes(MAX_CONFIG_BYTES)
            )));
        }
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Format::Json,
            Some("toml") => Format::Toml,
            _ if text.trim_start().starts_with('{') => Format::Json,
            _ => Format::Toml,
        };
        PoolConfig::parse(&text, format).map_err(|e| match e {
            Error::Config { message } => Error::config(format!("in {}: {message}", path.display())),
            other => other,
        })
    }

    /// Parse config text in the given format.
    ///
    /// # Errors
    /// [`Error::Config`] for syntax errors and unknown or mistyped keys.
    pub fn parse(text: &str, format: Format) -> Result<PoolConfig> {
        let value: Value = match format {
            Format::Toml => toml::from_str(text)
                .map_err(|e| Error::config(format!("TOML syntax error: {e}")))?,
            Format::Json => serde_json::from_str(text)
                .map_err(|e| Error::config(format!("JSON syntax error: {e}")))?,
        };
        PoolConfig::from_value(value)
    }

    /// Build a config from a JSON-like document (an object).
    ///
    /// # Errors
    /// [`Error::Config`] for a non-object, an unknown key that is not a table,
    /// or a mistyped pool setting (the message names the key).
    pub fn from_value(value: Value) -> Result<PoolConfig> {
        let Value::Object(map) = value else {
            return Err(Error::config(
                "the config must be a table of keys (a TOML document or a JSON object)",
            ));
        };
        let map = translate_hisparse(map)?;
        let mut pool = serde_json::Map::new();
        let mut plugins = BTreeMap::new();
        for (key, value) in map {
            if let Some((_, new)) = MOVED_KEYS.iter().find(|(old, _)| *old == key) {
                // A scalar as JSON writes it reads the same in TOML.
                return Err(Error::config(format!(
                    "`{key}` moved into the [lease] table as `{new}`: write `[lease]` then \
                     `{new} = {value}` (JSON: \"lease\": {{\"{new}\": {value}}})"
                )));
            }
            if POOL_KEYS.contains(&key.as_str()) {
                pool.insert(key, value);
            } else if value.is_object() {
                plugins.insert(key, value);
            } else {
                return Err(Error::config(format!(
                    "unknown key `{key}`; pool settings are {}, and plugin settings go in a table \
                     named after the plugin (for example [anon])",
                    POOL_KEYS.join(", ")
                )));
            }
        }
        let mut config: PoolConfig =
            serde_json::from_value(Value::Object(pool.clone())).map_err(|e| {
                // Find the key at fault: every field has a default, so a
                // one-key document fails only for that key.
                let culprit = pool.iter().find(|(k, v)| {
                    let one = serde_json::Map::from_iter([((*k).clone(), (*v).clone())]);
                    serde_json::from_value::<PoolConfig>(Value::Object(one)).is_err()
                });
                match culprit {
                    Some((k, _)) => Error::config(format!("`{k}`: {e}")),
                    None => Error::config(e.to_string()),
                }
            })?;
        config.plugins = plugins;
        if let Some(lease) = &mut config.lease
            && pool.contains_key("size")
        {
            lease.size = Some(config.size);
        }
        Ok(config)
    }

    /// The table of the named plugin, if the config has one.
    pub fn plugin_table(&self, name: &str) -> Option<&Value> {
        self.plugins.get(name)
    }
}

/// Keys of vLLM's HiSparse connector (`kv_connector_extra_config`, seed 000)
/// accepted as they are: `host_pool_gib` is the size in GiB, `host_pool_dir`
/// the directory (typically a hugetlbfs mount).
pub const HISPARSE_KEYS: [&str; 2] = ["host_pool_gib", "host_pool_dir"];

fn translate_hisparse(
    mut map: serde_json::Map<String, Value>,
) -> Result<serde_json::Map<String, Value>> {
    if let Some(gib) = map.remove("host_pool_gib") {
        if map.contains_key("size") {
            return Err(Error::config("give size or host_pool_gib, not both"));
        }
        let limit_gib = crate::layout::MAX_POOL_BYTES >> 30;
        if let Some(g) = gib.as_f64()
            && g > limit_gib as f64
        {
            return Err(Error::config(format!(
                "`host_pool_gib` = {gib} is more than the {limit_gib} GiB (64 PiB) a pool can \
                 have; ask for at most {limit_gib}"
            )));
        }
        let bytes = match &gib {
            Value::Number(n) if n.as_u64().is_some() => n.as_u64().and_then(|g| g.checked_mul(1 << 30)),
            Value::Number(n) => n
                .as_f64()
                .filter(|g| g.is_finite() && *g > 0.0 && (g * f64::from(1u32 << 30)).fract() == 0.0)
                .map(|g| (g * f64::from(1u32 << 30)) as u64),
            _ => None,
        }
        .ok_or_else(|| {
            Error::config(format!(
                "`host_pool_gib` must be a number of GiB (as vLLM's HiSparse connector takes it), not {gib}"
            ))
        })?;
        map.insert("size".into(), Value::from(bytes));
    }
    if let Some(dir) = map.remove("host_pool_dir") {
        if map.contains_key("dir") {
            return Err(Error::config("give dir or host_pool_dir, not both"));
        }
        if !dir.is_string() {
            return Err(Error::config(format!(
                "`host_pool_dir` must be a path, not {dir}"
            )));
        }
        map.insert("dir".into(), dir);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_is_a_number_gpu_or_one_node_per_rank() {
        for (text, want) in [
            ("numa_node = 1", NumaNode::Node(1)),
            ("numa_node = \"gpu\"", NumaNode::Gpu),
            ("numa_node = \"GPU\"", NumaNode::Gpu),
            (
                "numa_node = [0, 0, 1, 1]",
                NumaNode::PerRank(vec![0, 0, 1, 1]),
            ),
        ] {
            let c = PoolConfig::parse(text, Format::Toml).unwrap();
            assert_eq!(c.numa_node.as_ref(), Some(&want), "{text}");
            // What a report says is what a config reads back.
            let v = serde_json::to_value(&want).unwrap();
            assert_eq!(serde_json::from_value::<NumaNode>(v).unwrap(), want);
        }
        assert_eq!(serde_json::to_value(NumaNode::Gpu).unwrap(), "gpu");
        assert_eq!(serde_json::to_value(NumaNode::Node(3)).unwrap(), 3);
        for (text, needle) in [
            ("numa_node = \"cpu\"", "\"cpu\" is not a node"),
            ("numa_node = -1", "-1 is not a node number"),
            ("numa_node = [0, -2]", "-2 is not a node number"),
            ("numa_node = 1.5", "numa_node must be"),
            ("numa_node = [\"gpu\"]", "numa_node must be"),
        ] {
            let e = PoolConfig::parse(text, Format::Toml).unwrap_err();
            assert!(
                e.is_usage() && e.to_string().contains(needle),
                "{text}: {e}"
            );
        }
        assert_eq!(NumaNode::parse(" 2 ").unwrap(), NumaNode::Node(2));
        assert_eq!(NumaNode::parse("gpu").unwrap(), NumaNode::Gpu);
        assert_eq!(
            NumaNode::parse("0,1").unwrap(),
            NumaNode::PerRank(vec![0, 1])
        );
        for bad in ["", "-1", "x", "0,,1", "0,x", "99999999999"] {
            assert!(NumaNode::parse(bad).unwrap_err().is_usage(), "{bad:?}");
        }
        assert_eq!(NumaNode::PerRank(vec![0, 1]).to_string(), "[0, 1]");
    }

    #[test]
    fn pool_keys_match_the_serialized_fields() {
        let mut full = PoolConfig {
            dir: Some("/x".into()),
            page_size: Some(ByteSize(4096)),
            threads: NonZeroUsize::new(1),
            block_size: Some(ByteSize(4096)),
            sharing: Some(SharingConfig {
                name: "n".into(),
                world: 1,
                rank: 0,
                attach_timeout_secs: 1.0,
                barrier_timeout_secs: 600.0,
                rendezvous: crate::config::Rendezvous::File,
                control_dir: None,
            }),
            numa_node: Some(NumaNode::Node(0)),
            lease: Some(LeaseConfig::of("kv0")),
            huge_pages: Some(HugePages::Prefer),
            ..PoolConfig::default()
        };
        full.register.push("r".into());
        let v = serde_json::to_value(&full).unwrap();
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        let mut want: Vec<_> = POOL_KEYS.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(
            keys, want,
            "POOL_KEYS must list exactly the fields of PoolConfig"
        );
    }

    #[test]
    fn a_companion_names_a_keeper_and_takes_no_rank_keys() {
        let parse = |text: &str| {
            PoolConfig::parse(text, Format::Toml).and_then(|c| {
                c.lease
                    .as_ref()
                    .map(|l| l.validate(c.sharing.as_ref()).map(|_| ()))
                    .unwrap_or(Ok(()))
            })
        };
        assert!(parse("[lease]\nkeeper = \"kv0\"\ncompanion_of = \"vllm-e0\"\n").is_ok());
        let err = |text: &str| parse(text).unwrap_err().to_string();
        let msg = err("[lease]\ncompanion_of = \"vllm-e0\"\n");
        assert!(
            msg.contains("`lease.companion_of` is given but no keeper `lease.keeper` (--keeper"),
            "{msg}"
        );
        let msg = err("[lease]\nkeeper = \"kv0\"\ncompanion_of = \"vllm-e0\"\n\
             [sharing]\nname = \"vllm-e0\"\nworld = 2\nrank = 0\n");
        assert!(msg.contains("`sharing` is for an engine's ranks"), "{msg}");
        let msg = err("[lease]\nkeeper = \"kv0\"\ncompanion_of = \"a b\"\n");
        assert!(msg.contains("lease.companion_of name `a b`"), "{msg}");
    }

    /// The lease's old flat keys are refused, each naming its place in the
    /// [lease] table, in TOML and JSON; the table gets the size only when
    /// one was given.
    #[test]
    fn an_old_flat_lease_key_names_its_new_place() {
        for (old, new) in MOVED_KEYS {
            let value = if *old == "keeper_attach_timeout_secs" {
                "5.0"
            } else {
                "\"x\""
            };
            let msg = PoolConfig::parse(&format!("{old} = {value}\n"), Format::Toml)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(&format!("`{old}` moved into the [lease] table as `{new}`"))
                    && msg.contains(&format!("`{new} = {value}`"))
                    && msg.contains(&format!("\"lease\": {{\"{new}\": {value}}}")),
                "{msg}"
            );
        }
        let c = PoolConfig::parse("[lease]\nkeeper = \"kv0\"\n", Format::Toml).unwrap();
        assert_eq!(c.lease, Some(LeaseConfig::of("kv0")));
        let c = PoolConfig::parse("size = \"8MiB\"\n[lease]\nkeeper = \"kv0\"\n", Format::Toml)
            .unwrap();
        assert_eq!(c.lease.unwrap().size, Some(ByteSize(8 << 20)));
        let e = PoolConfig::parse("[lease]\nkeeper = \"kv0\"\ntagg = 1\n", Format::Toml)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`lease`") && e.contains("tagg"), "{e}");
    }

    #[test]
    fn toml_with_plugin_table_parses() {
        let c = PoolConfig::parse(
            "size = \"4GiB\"\nbacking = \"anon\"\nthreads = 2\nprefault = \"touch\"\n[anon]\nthp = true\n",
            Format::Toml,
        )
        .unwrap();
        assert_eq!(c.size, ByteSize::gib(4));
        assert_eq!(c.backing, "anon");
        assert_eq!(c.threads, NonZeroUsize::new(2));
        assert_eq!(c.prefault, PrefaultChoice::Touch);
        assert_eq!(
            c.plugin_table("anon"),
            Some(&serde_json::json!({"thp": true}))
        );
    }

    #[test]
    fn json_parses_and_defaults_apply() {
        let c = PoolConfig::parse("{\"size\": 1048576}", Format::Json).unwrap();
        assert_eq!(c.size, ByteSize(1 << 20));
        assert_eq!(c.backing, "auto");
        assert!(!c.pin.is_on());
        assert_eq!(
            PoolConfig::parse("{}", Format::Json).unwrap(),
            PoolConfig::default()
        );
    }

    #[test]
    fn unknown_scalar_keys_are_rejected_with_the_list_of_keys() {
        let e = PoolConfig::parse("sise = \"4GiB\"", Format::Toml).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("unknown key `sise`"), "{msg}");
        assert!(msg.contains("size, backing"), "{msg}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn mistyped_values_name_the_key() {
        let msg = PoolConfig::parse("size = \"384G\"", Format::Toml)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`size`") && msg.contains("384GiB"), "{msg}");
        let msg = PoolConfig::parse("threads = 0", Format::Toml)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`threads`"), "{msg}");
        let msg = PoolConfig::parse("prefault = \"fast\"", Format::Toml)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("`prefault`") && msg.contains("populate-write"),
            "{msg}"
        );
        let msg = PoolConfig::parse("[pin]\nkind = \"cuda\"\nrequird = true", Format::Toml)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`pin`") && msg.contains("requird"), "{msg}");
    }

    #[test]
    fn syntax_errors_and_non_tables_are_config_errors() {
        assert!(matches!(
            PoolConfig::parse("size = ", Format::Toml),
            Err(Error::Config { .. })
        ));
        assert!(matches!(
            PoolConfig::parse("[1, 2]", Format::Json),
            Err(Error::Config { .. })
        ));
    }

    #[test]
    fn sharing_parses_and_validates() {
        let c = PoolConfig::parse(
            "[sharing]\nname = \"e0\"\nworld = 4\nrank = 3\n",
            Format::Toml,
        )
        .unwrap();
        let s = c.sharing.unwrap();
        assert_eq!((s.world, s.rank, s.attach_timeout_secs), (4, 3, 30.0));
        assert!(s.validate().is_ok());
        let bad = |name: &str, world, rank, t: f64| {
            SharingConfig {
                name: name.into(),
                world,
                rank,
                attach_timeout_secs: t,
                barrier_timeout_secs: 600.0,
                rendezvous: crate::config::Rendezvous::File,
                control_dir: None,
            }
            .validate()
            .unwrap_err()
            .to_string()
        };
        assert!(bad("e0", 4, 4, 1.0).contains("rank 4 must be below world 4"));
        assert!(bad("e0", 0, 0, 1.0).contains("world 0"));
        assert!(bad("../etc", 1, 0, 1.0).contains("must be 1 to 64"));
        assert!(bad("", 1, 0, 1.0).contains("must be 1 to 64"));
        assert!(bad("e0", 1, 0, 0.0).contains("positive"));
        let msg = PoolConfig::parse("[sharing]\nname = \"e0\"\nworld = 4\n", Format::Toml)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`sharing`") && msg.contains("rank"), "{msg}");
    }

    #[test]
    fn vllm_hisparse_keys_work_unchanged() {
        let c = PoolConfig::parse(
            r#"{"host_pool_gib": 384, "host_pool_dir": "/dev/hugepages-1Gi"}"#,
            Format::Json,
        )
        .unwrap();
        assert_eq!(c.size, ByteSize::gib(384));
        assert_eq!(c.dir.as_deref(), Some(Path::new("/dev/hugepages-1Gi")));
        assert_eq!(c.backing, "auto");
        let c = PoolConfig::parse(r#"{"host_pool_gib": 1.5}"#, Format::Json).unwrap();
        assert_eq!(c.size, ByteSize(3 << 29));
        for (bad, want) in [
            (r#"{"host_pool_gib": 4, "size": "4GiB"}"#, "not both"),
            (r#"{"host_pool_gib": "384"}"#, "number of GiB"),
            (r#"{"host_pool_gib": -1}"#, "number of GiB"),
            (r#"{"host_pool_gib": 1e30}"#, "67108864 GiB (64 PiB)"),
            (
                r#"{"host_pool_gib": 18446744073709551615}"#,
                "67108864 GiB (64 PiB)",
            ),
            (r#"{"host_pool_dir": 7}"#, "must be a path"),
            (r#"{"host_pool_dir": "/a", "dir": "/b"}"#, "not both"),
        ] {
            let e = PoolConfig::parse(bad, Format::Json)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn from_path_names_the_file() {
        let e = PoolConfig::from_path(Path::new("/nonexistent/pool.toml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/pool.toml"), "{e}");
    }
}
