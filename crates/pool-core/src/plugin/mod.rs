//! What a plugin implements and submits: the traits, the records collected
//! with `inventory` (with what each plugin owns: its `auto` claim, its cost
//! figures, its doctor hook), and lookup by name.
//!
//! A plugin crate submits a record at the top level of its `lib.rs`:
//!
//! ```
//! use pool_core::plugin::{Backing, BackingPlugin};
//! use pool_core::{Error, Result};
//!
//! fn build(_table: Option<&serde_json::Value>) -> Result<Box<dyn Backing>> {
//!     Err(Error::config("this example builds nothing"))
//! }
//!
//! pool_core::inventory::submit! {
//!     BackingPlugin::new("example", "an example record", env!("CARGO_PKG_NAME"), build)
//! }
//!
//! let found = pool_core::plugin::lookup::<BackingPlugin>("example").unwrap();
//! assert_eq!(found.summary, "an example record");
//! ```
//!
//! **Linking pitfall:** a crate that is only listed in `Cargo.toml` and never
//! named in code is not linked, and its records silently vanish. The binary
//! must name it (`use my_backing as _;`).
//!
//! The `auto` rule lives here and nowhere else ([`auto_backing`]): each
//! backing's record says what it claims, and the highest priority wins.

mod cost;
mod doctor;
mod traits;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use cost::{CostInputs, PREFAULT_CEILING_GBPS, Predicted, REGISTER_SECONDS_PER_PAGE, predict};
pub use doctor::{DoctorContext, DoctorFn, Finding, Level, PoolFacts, split_reason};
pub use traits::{
    Backing, BackingPlan, CreateFile, ExtentReport, FilePlan, Mapping, MemorySource, Pin,
    PinContext, Pinner, RankBarrier, Recheck, Registrar, Registration, unmap_at_teardown,
};

use crate::config::PoolConfig;
use crate::error::{Error, Result};
use crate::host::fs::{FsInfo, statfs_info};

/// Parses the plugin's own config table (`None` when the config has none)
/// into a configured plugin object. Must not create anything.
pub type BuildFn<T> = fn(Option<&Value>) -> Result<Box<T>>;

/// The directory `backing = "auto"` must serve, as `statfs` sees it.
#[derive(Debug, Clone, Copy)]
pub struct AutoDir<'a> {
    /// The directory.
    pub path: &'a Path,
    /// Its filesystem.
    pub fs: FsInfo,
}

/// A backing's claim on a pool under `backing = "auto"` ([`AutoClaim::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AutoClaim {
    /// Higher wins; two claims of the same priority are an error naming both.
    pub priority: u32,
    /// One line saying why, for `hostpool plan`.
    pub reason: String,
}

impl AutoClaim {
    /// A claim of `priority`, with one line saying why.
    pub fn new(priority: u32, reason: impl Into<String>) -> AutoClaim {
        AutoClaim {
            priority,
            reason: reason.into(),
        }
    }
}

/// What `backing = "auto"` must serve.
#[derive(Debug, Clone, Copy)]
pub struct AutoQuery<'a> {
    /// The pool's `dir`, when one is given.
    pub dir: Option<AutoDir<'a>>,
    /// Whether the pool is shared between processes (`sharing`), which
    /// needs memory that other processes can open.
    pub shared: bool,
    /// The pool's `huge_pages` policy, when it has one: a backing of huge
    /// pages claims a pool without a dir under `required` and `prefer`.
    pub huge_pages: Option<crate::config::HugePages>,
}

/// Whether a backing serves `auto` for a query. Pure apart from reading the
/// host; creates nothing.
pub type AutoFn = fn(&AutoQuery<'_>) -> Option<AutoClaim>;

/// The directories where a backing's pool files live by default, which
/// `hostpool gc` (and `doctor`'s leftovers) scan when given none. Reads the
/// host (the mount table, say); creates nothing.
pub type GcDirsFn = fn() -> Vec<PathBuf>;

/// Prefault rates of a backing for `hostpool plan`'s predictions: GB/s
/// (10^9 bytes) of one thread, by page size, measured on the project's CI
/// machines (`hostpool bench` measures the node at hand).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct PrefaultCost {
    /// Base (4 KiB) pages.
    pub base_gbps: f64,
    /// 2 MiB pages.
    pub huge_2m_gbps: f64,
    /// 1 GiB pages.
    pub huge_1g_gbps: f64,
}

impl PrefaultCost {
    /// What faulting anonymous memory costs: the rate of a backing that
    /// says nothing of its own.
    pub const DEFAULT: PrefaultCost = PrefaultCost {
        base_gbps: 3.1,
        huge_2m_gbps: 11.0,
        huge_1g_gbps: 25.0,
    };

    /// These rates of one thread: base, 2 MiB and 1 GiB pages.
    pub const fn new(base_gbps: f64, huge_2m_gbps: f64, huge_1g_gbps: f64) -> PrefaultCost {
        PrefaultCost {
            base_gbps,
            huge_2m_gbps,
            huge_1g_gbps,
        }
    }

    /// With this rate for base pages, the others kept.
    #[must_use]
    pub const fn with_base_gbps(mut self, gbps: f64) -> PrefaultCost {
        self.base_gbps = gbps;
        self
    }

    /// The per-thread rate for a page size.
    pub fn gbps(&self, page: u64) -> f64 {
        if page >= 1 << 30 {
            self.huge_1g_gbps
        } else if page >= 2 << 20 {
            self.huge_2m_gbps
        } else {
            self.base_gbps
        }
    }
}

/// What pinning or registering costs, for `hostpool plan`'s predictions.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct PinCost {
    /// Seconds per page pinned (registration costs are per page, which is
    /// why huge pages win).
    pub seconds_per_page: f64,
    /// Whether reserved huge pages cost nothing (`mlock` of hugetlb pages
    /// is a no-op).
    pub free_on_huge_pages: bool,
}

impl PinCost {
    /// `seconds_per_page`, and whether reserved huge pages are free.
    pub const fn new(seconds_per_page: f64, free_on_huge_pages: bool) -> PinCost {
        PinCost {
            seconds_per_page,
            free_on_huge_pages,
        }
    }
}

/// A backing plugin record. Build it with [`BackingPlugin::new`] and the
/// `with_*` methods, all `const`, so it can be submitted with
/// `inventory::submit!`; fields added later do not break a plugin.
#[derive(Debug)]
#[non_exhaustive]
pub struct BackingPlugin {
    /// The name config and CLI select it by.
    pub name: &'static str,
    /// One line for `hostpool plugins`.
    pub summary: &'static str,
    /// The crate that submitted it (`env!("CARGO_PKG_NAME")`).
    pub origin: &'static str,
    /// Parse options and build.
    pub build: BuildFn<dyn Backing>,
    /// Its claim under `backing = "auto"`, if it makes one.
    pub auto: Option<AutoFn>,
    /// The filesystems that claim covers, for the error when none does
    /// (`["tmpfs"]`; empty for a claim on pools without a dir).
    pub auto_filesystems: &'static [&'static str],
    /// Its prefault rates, for predictions ([`PrefaultCost::DEFAULT`] when
    /// none).
    pub cost: Option<PrefaultCost>,
    /// Its findings for `hostpool doctor`.
    pub doctor: Option<DoctorFn>,
    /// The directories `hostpool gc` scans for its files by default (none:
    /// it leaves no files, or only in directories the user names).
    pub gc_dirs: Option<GcDirsFn>,
}

impl BackingPlugin {
    /// A record with no `auto` claim, no cost figures, no doctor hook and
    /// no `gc` directories.
    pub const fn new(
        name: &'static str,
        summary: &'static str,
        origin: &'static str,
        build: BuildFn<dyn Backing>,
    ) -> BackingPlugin {
        BackingPlugin {
            name,
            summary,
            origin,
            build,
            auto: None,
            auto_filesystems: &[],
            cost: None,
            doctor: None,
            gc_dirs: None,
        }
    }

    /// With a claim under `backing = "auto"` on these filesystems (none for
    /// a claim on pools without a dir).
    #[must_use]
    pub const fn with_auto(
        mut self,
        auto: AutoFn,
        filesystems: &'static [&'static str],
    ) -> BackingPlugin {
        self.auto = Some(auto);
        self.auto_filesystems = filesystems;
        self
    }

    /// With prefault rates.
    #[must_use]
    pub const fn with_cost(mut self, cost: PrefaultCost) -> BackingPlugin {
        self.cost = Some(cost);
        self
    }

    /// With a doctor hook.
    #[must_use]
    pub const fn with_doctor(mut self, doctor: DoctorFn) -> BackingPlugin {
        self.doctor = Some(doctor);
        self
    }

    /// With the directories `hostpool gc` scans for its files by default.
    #[must_use]
    pub const fn with_gc_dirs(mut self, dirs: GcDirsFn) -> BackingPlugin {
        self.gc_dirs = Some(dirs);
        self
    }
}

macro_rules! pin_like_record {
    ($(#[$doc:meta])* $t:ident, $trait:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        #[non_exhaustive]
        pub struct $t {
            /// The name config and CLI select it by.
            pub name: &'static str,
            /// One line for `hostpool plugins`.
            pub summary: &'static str,
            /// The crate that submitted it.
            pub origin: &'static str,
            /// Parse options and build.
            pub build: BuildFn<dyn $trait>,
            /// What it costs per page, for predictions (none: not predicted).
            pub cost: Option<PinCost>,
            /// Its findings for `hostpool doctor`.
            pub doctor: Option<DoctorFn>,
        }

        impl $t {
            /// A record with no cost figures and no doctor hook.
            pub const fn new(
                name: &'static str,
                summary: &'static str,
                origin: &'static str,
                build: BuildFn<dyn $trait>,
            ) -> $t {
                $t {
                    name,
                    summary,
                    origin,
                    build,
                    cost: None,
                    doctor: None,
                }
            }

            /// With its cost per page.
            #[must_use]
            pub const fn with_cost(mut self, cost: PinCost) -> $t {
                self.cost = Some(cost);
                self
            }

            /// With a doctor hook.
            #[must_use]
            pub const fn with_doctor(mut self, doctor: DoctorFn) -> $t {
                self.doctor = Some(doctor);
                self
            }
        }
    };
}

pin_like_record!(
    /// A pinner plugin record; build it with [`PinnerPlugin::new`].
    PinnerPlugin,
    Pinner
);
pin_like_record!(
    /// A registrar plugin record; build it with [`RegistrarPlugin::new`].
    RegistrarPlugin,
    Registrar
);

/// A GPU as its plugin finds it: the device's ordinal and its PCI address
/// (which places it on a NUMA node, [`crate::host::numa::pci_place`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GpuDevice {
    /// The device's ordinal, as the plugin's config names it (`[cuda]
    /// device`).
    pub ordinal: u32,
    /// Its PCI address as the driver writes it (`0000:3B:00.0`).
    pub pci_address: String,
    /// The device's name, when the driver says (`NVIDIA H200`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl GpuDevice {
    /// Device `ordinal` at `pci_address`.
    pub fn new(ordinal: u32, pci_address: impl Into<String>) -> GpuDevice {
        GpuDevice {
            ordinal,
            pci_address: pci_address.into(),
            name: None,
        }
    }

    /// With the device's name.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> GpuDevice {
        self.name = Some(name.into());
        self
    }
}

/// The GPU a pool's config selects (the plugin's own table, `None` when the
/// config has none: its default device). Loads the driver; maps nothing.
pub type LocateFn = fn(Option<&Value>) -> Result<GpuDevice>;

/// Every GPU the driver sees, for `hostpool doctor`'s table.
pub type ListGpusFn = fn() -> Result<Vec<GpuDevice>>;

/// A GPU plugin record: how `numa_node = "gpu"` finds the GPU a pool is for
/// and where it sits. Build it with [`GpuPlugin::new`]; the crate that pins
/// with a GPU's driver (`pinner-cuda`) submits one under the same name.
#[derive(Debug)]
#[non_exhaustive]
pub struct GpuPlugin {
    /// The name (the pinner's, `cuda`).
    pub name: &'static str,
    /// One line for `hostpool plugins`.
    pub summary: &'static str,
    /// The crate that submitted it.
    pub origin: &'static str,
    /// The GPU a config selects.
    pub locate: LocateFn,
    /// Every GPU.
    pub list: ListGpusFn,
}

impl GpuPlugin {
    /// A record.
    pub const fn new(
        name: &'static str,
        summary: &'static str,
        origin: &'static str,
        locate: LocateFn,
        list: ListGpusFn,
    ) -> GpuPlugin {
        GpuPlugin {
            name,
            summary,
            origin,
            locate,
            list,
        }
    }
}

inventory::collect!(GpuPlugin);

/// The GPU plugin `numa_node = "gpu"` asks: the one named like the pool's
/// pinner, else the only one linked.
///
/// # Errors
/// [`Error::Config`] when none is linked, or several are and the pinner
/// names none of them.
pub fn gpu_plugin(config: &PoolConfig) -> Result<&'static GpuPlugin> {
    let reg = registry::<GpuPlugin>()?;
    if let Some(p) = config.pin.kind.as_deref().and_then(|k| reg.get(k)) {
        return Ok(p);
    }
    let mut all = reg.values();
    match (all.next(), all.next()) {
        (Some(p), None) => Ok(p),
        (None, _) => Err(Error::config(
            "numa_node = \"gpu\" needs a GPU plugin (pinner-cuda) to find the GPU, and this \
             build links none; give the node as a number",
        )),
        (Some(_), Some(_)) => Err(Error::config(format!(
            "numa_node = \"gpu\": several GPU plugins are linked ({}); set pin.kind to the one \
             whose GPU the pool is for, or give the node as a number",
            reg.keys().copied().collect::<Vec<_>>().join(", ")
        ))),
    }
}

inventory::collect!(BackingPlugin);
inventory::collect!(PinnerPlugin);
inventory::collect!(RegistrarPlugin);

/// Checks an adapter's own config table (`None` when the config has none):
/// parses it (with [`parse_table`], say) and builds nothing.
pub type ValidateFn = fn(Option<&Value>) -> Result<()>;

/// An adapter plugin record: a table of the pool's config for something the
/// embedder drives with that thing's own objects (Mooncake's Python engine,
/// say), which is no backing, pinner or registrar. The core only validates
/// the table ([`validate_plugin_tables`]) and runs the doctor hook; the
/// embedder reads the table (`PoolConfig::plugin_table`). Build it with
/// [`AdapterPlugin::new`] and [`AdapterPlugin::with_doctor`], both `const`,
/// so it can be submitted with `inventory::submit!`.
#[derive(Debug)]
#[non_exhaustive]
pub struct AdapterPlugin {
    /// The name of its config table.
    pub name: &'static str,
    /// One line for `hostpool plugins`.
    pub summary: &'static str,
    /// The crate that submitted it.
    pub origin: &'static str,
    /// Check its table.
    pub validate: ValidateFn,
    /// Its findings for `hostpool doctor`.
    pub doctor: Option<DoctorFn>,
}

impl AdapterPlugin {
    /// A record with no doctor hook.
    pub const fn new(
        name: &'static str,
        summary: &'static str,
        origin: &'static str,
        validate: ValidateFn,
    ) -> AdapterPlugin {
        AdapterPlugin {
            name,
            summary,
            origin,
            validate,
            doctor: None,
        }
    }

    /// With a doctor hook.
    #[must_use]
    pub const fn with_doctor(mut self, doctor: DoctorFn) -> AdapterPlugin {
        self.doctor = Some(doctor);
        self
    }
}

inventory::collect!(AdapterPlugin);

/// What the registry needs of a record.
pub trait PluginRecord: Sync + 'static {
    /// "backing", "pinner", "registrar", "gpu" or "adapter".
    const KIND: &'static str;
    /// The plugin's name.
    fn name(&self) -> &'static str;
    /// The crate that submitted it.
    fn origin(&self) -> &'static str;
    /// One line of description.
    fn summary(&self) -> &'static str;
    /// Its doctor hook, if any.
    fn doctor(&self) -> Option<DoctorFn>;
    /// Every submitted record of this kind, in no particular order.
    fn all() -> Vec<&'static Self>;
}

macro_rules! record {
    ($t:ty, $kind:literal) => {
        record!($t, $kind, |r: &$t| r.doctor);
    };
    ($t:ty, $kind:literal, $doctor:expr) => {
        impl $crate::plugin::PluginRecord for $t {
            const KIND: &'static str = $kind;
            fn name(&self) -> &'static str {
                self.name
            }
            fn origin(&self) -> &'static str {
                self.origin
            }
            fn summary(&self) -> &'static str {
                self.summary
            }
            fn doctor(&self) -> Option<$crate::plugin::DoctorFn> {
                ($doctor)(self)
            }
            fn all() -> Vec<&'static Self> {
                $crate::inventory::iter::<$t>.into_iter().collect()
            }
        }
    };
}

record!(BackingPlugin, "backing");
record!(PinnerPlugin, "pinner");
record!(RegistrarPlugin, "registrar");
// A GPU record has no doctor hook: its plugin's pinner record has one.
record!(GpuPlugin, "gpu", |_: &GpuPlugin| None);
record!(AdapterPlugin, "adapter");

/// All records of one kind by name.
///
/// # Errors
/// [`Error::DuplicatePlugin`] when two records share a name.
pub fn registry<T: PluginRecord>() -> Result<BTreeMap<&'static str, &'static T>> {
    index(T::all())
}

fn index<T: PluginRecord>(records: Vec<&'static T>) -> Result<BTreeMap<&'static str, &'static T>> {
    let mut map: BTreeMap<&'static str, &'static T> = BTreeMap::new();
    for r in records {
        if let Some(prev) = map.insert(r.name(), r) {
            let (first, second) = if prev.origin() <= r.origin() {
                (prev.origin(), r.origin())
            } else {
                (r.origin(), prev.origin())
            };
            return Err(Error::DuplicatePlugin {
                kind: T::KIND,
                name: r.name(),
                first,
                second,
            });
        }
    }
    Ok(map)
}

/// The sorted names of one kind.
///
/// # Errors
/// [`Error::DuplicatePlugin`].
pub fn names<T: PluginRecord>() -> Result<Vec<&'static str>> {
    Ok(registry::<T>()?.into_keys().collect())
}

/// Find a record by name.
///
/// # Errors
/// [`Error::UnknownPlugin`] listing the sorted available names, or
/// [`Error::DuplicatePlugin`].
pub fn lookup<T: PluginRecord>(name: &str) -> Result<&'static T> {
    let reg = registry::<T>()?;
    reg.get(name).copied().ok_or_else(|| Error::UnknownPlugin {
        kind: T::KIND,
        name: name.to_string(),
        available: if reg.is_empty() {
            "none registered".to_string()
        } else {
            reg.keys().copied().collect::<Vec<_>>().join(", ")
        },
    })
}

/// Which backing a config selects, and why.
#[derive(Debug, Clone)]
pub struct BackingSelection {
    /// The record.
    pub plugin: &'static BackingPlugin,
    /// One line saying why it was chosen.
    pub reason: String,
}

/// The backing `auto` resolves to for a directory (`None`: no `dir`) and a
/// private or shared pool, and why: the registered backing whose [`AutoFn`]
/// claims it with the highest priority. The core names no backing; each
/// backing claims what it serves.
///
/// # Errors
/// [`Error::Config`] when `dir` cannot be examined, when no backing claims
/// it, or when two claim it with the same priority (naming both).
pub fn auto_backing(
    dir: Option<&Path>,
    shared: bool,
    huge_pages: Option<crate::config::HugePages>,
) -> Result<(&'static BackingPlugin, String)> {
    let fs = match dir {
        None => None,
        Some(path) => Some(AutoDir {
            path,
            fs: statfs_info(path).map_err(|e| {
                Error::on_input_path(
                    "statfs",
                    path,
                    e,
                    format!("cannot examine dir {}", path.display()),
                    "create it, or mount a filesystem a backing serves there (hugetlbfs or tmpfs \
                     for the built-in ones)",
                )
            })?,
        }),
    };
    let reg = registry::<BackingPlugin>()?;
    let mut claims: Vec<(&'static BackingPlugin, AutoClaim)> = reg
        .values()
        .filter_map(|p| {
            Some((
                *p,
                (p.auto?)(&AutoQuery {
                    dir: fs,
                    shared,
                    huge_pages,
                })?,
            ))
        })
        .collect();
    claims.sort_by(|a, b| b.1.priority.cmp(&a.1.priority).then(a.0.name.cmp(b.0.name)));
    match claims.as_slice() {
        [] => {
            let filesystems: Vec<&str> = reg
                .values()
                .flat_map(|p| p.auto_filesystems.iter().copied())
                .collect();
            let what = match (dir, fs) {
                (Some(d), Some(f)) => format!(
                    "dir {} is {} (filesystem magic {:#x})",
                    d.display(),
                    neither_nor(&filesystems),
                    f.fs.magic
                ),
                _ if shared => "no backing serves a shared pool without a dir".to_string(),
                _ => "no backing serves a pool without a dir".to_string(),
            };
            Err(Error::config(format!(
                "backing = auto cannot serve this pool: {what}; mount hugetlbfs there (`mount -t \
                 hugetlbfs -o pagesize=1G none DIR`), use /dev/shm, or name a backing explicitly"
            )))
        }
        [(first, a), (second, b), ..] if a.priority == b.priority => Err(Error::config(format!(
            "backing = auto is ambiguous: `{}` and `{}` both claim it with priority {}; name a \
             backing explicitly",
            first.name, second.name, a.priority
        ))),
        [(winner, claim), ..] => Ok((winner, format!("backing = auto: {}", claim.reason))),
    }
}

/// "neither a nor b", "neither a, b nor c", "not a", or "claimed by no
/// backing" for none.
fn neither_nor(names: &[&str]) -> String {
    match names {
        [] => "claimed by no backing".to_string(),
        [one] => format!("not {one}"),
        [init @ .., last] => format!("neither {} nor {last}", init.join(", ")),
    }
}

/// Resolve `config.backing` (including `auto`) to a registered record, for
/// memory other processes map (`shared`: a shared or kept pool) or not.
///
/// # Errors
/// As for [`auto_backing`] and [`lookup`].
pub fn select_backing(config: &PoolConfig, shared: bool) -> Result<BackingSelection> {
    let (plugin, reason) = if config.backing == "auto" {
        auto_backing(config.dir.as_deref(), shared, config.huge_pages)?
    } else {
        let plugin = lookup::<BackingPlugin>(&config.backing)?;
        (plugin, format!("backing = {} was asked for", plugin.name))
    };
    Ok(BackingSelection { plugin, reason })
}

/// Parse every plugin table in the config with its own plugin, so a typo in
/// the table of a plugin that is not selected is still caught.
///
/// An adapter's table ([`AdapterPlugin`]) is checked by the adapter.
///
/// # Errors
/// [`Error::Config`] naming a table that belongs to no registered plugin, or
/// the plugin's own error for its table.
pub fn validate_plugin_tables(config: &PoolConfig) -> Result<()> {
    for (name, table) in &config.plugins {
        let table = Some(table);
        if let Ok(p) = lookup::<BackingPlugin>(name) {
            (p.build)(table)?;
        } else if let Ok(p) = lookup::<PinnerPlugin>(name) {
            (p.build)(table)?;
        } else if let Ok(p) = lookup::<RegistrarPlugin>(name) {
            (p.build)(table)?;
        } else if let Ok(p) = lookup::<AdapterPlugin>(name) {
            (p.validate)(table)?;
        } else {
            let mut all: Vec<&str> = names::<BackingPlugin>()?;
            all.extend(names::<PinnerPlugin>()?);
            all.extend(names::<RegistrarPlugin>()?);
            all.extend(names::<AdapterPlugin>()?);
            all.sort_unstable();
            return Err(Error::config(format!(
                "table [{name}] belongs to no registered plugin; plugin tables available: {}",
                if all.is_empty() {
                    "none".to_string()
                } else {
                    all.join(", ")
                }
            )));
        }
    }
    Ok(())
}

/// Parse a plugin's table with `deny_unknown_fields` semantics into `T`
/// (defaults when absent), with an error that names the table.
///
/// # Errors
/// [`Error::Config`] naming the table and the bad key.
pub fn parse_table<T: serde::de::DeserializeOwned + Default>(
    plugin: &str,
    table: Option<&Value>,
) -> Result<T> {
    match table {
        None => Ok(T::default()),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| Error::config(format!("in table [{plugin}]: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(name: &'static str, origin: &'static str) -> &'static BackingPlugin {
        fn build(_: Option<&Value>) -> Result<Box<dyn Backing>> {
            Err(Error::config("test record"))
        }
        Box::leak(Box::new(BackingPlugin::new(name, "test", origin, build)))
    }

    #[test]
    fn duplicate_names_are_an_error_naming_both_crates() {
        let e = index(vec![
            fake("a", "crate-two"),
            fake("b", "x"),
            fake("a", "crate-one"),
        ])
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::DuplicatePlugin {
                    name: "a",
                    first: "crate-one",
                    second: "crate-two",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn index_is_sorted_whatever_the_submission_order() {
        let m = index(vec![
            fake("zeta", "z"),
            fake("alpha", "a"),
            fake("mid", "m"),
        ])
        .unwrap();
        assert_eq!(
            m.keys().copied().collect::<Vec<_>>(),
            ["alpha", "mid", "zeta"]
        );
    }

    #[test]
    fn pool_core_alone_registers_nothing_and_says_so() {
        // pool-core's own tests link no plugin crate.
        let e = lookup::<BackingPlugin>("anon").unwrap_err();
        assert!(e.to_string().contains("none registered"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn auto_with_no_claimant_says_which_backings_claim_and_what_to_do() {
        // pool-core alone registers no backing, so nothing claims anything.
        let e = auto_backing(None, false, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("no backing serves a pool without a dir"),
            "{e}"
        );
        let e = auto_backing(Some(Path::new("/proc")), false, None).unwrap_err();
        assert!(e.to_string().contains("claimed by no backing"), "{e}");
        assert_eq!(
            neither_nor(&["hugetlbfs", "tmpfs"]),
            "neither hugetlbfs nor tmpfs"
        );
        assert_eq!(neither_nor(&["a", "b", "c"]), "neither a, b nor c");
        let e = auto_backing(Some(Path::new("/nonexistent/dir")), false, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot examine dir /nonexistent/dir"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn unknown_plugin_tables_are_rejected() {
        let mut c = PoolConfig::default();
        c.plugins
            .insert("anno".into(), serde_json::json!({"thp": true}));
        let e = validate_plugin_tables(&c).unwrap_err();
        assert!(
            e.to_string()
                .contains("table [anno] belongs to no registered plugin"),
            "{e}"
        );
    }

    /// An adapter submitted as a plugin crate submits one: its table takes
    /// one key, `limit`, which must not be 0.
    fn validate_test_adapter(table: Option<&Value>) -> Result<()> {
        #[derive(serde::Deserialize, Default, Debug)]
        #[serde(deny_unknown_fields)]
        struct Opts {
            limit: Option<u32>,
        }
        let o: Opts = parse_table("test-adapter", table)?;
        if o.limit == Some(0) {
            return Err(Error::config("[test-adapter] limit is 0; give 1 or more"));
        }
        Ok(())
    }

    inventory::submit! {
        AdapterPlugin::new("test-adapter", "a test adapter", "pool-core tests", validate_test_adapter)
    }

    #[test]
    fn a_table_named_after_an_adapter_is_validated_by_it() {
        let with = |table: Value| {
            let mut c = PoolConfig::default();
            c.plugins.insert("test-adapter".into(), table);
            validate_plugin_tables(&c)
        };
        with(serde_json::json!({})).unwrap();
        with(serde_json::json!({"limit": 3})).unwrap();
        let e = with(serde_json::json!({"limt": 3})).unwrap_err();
        assert!(
            e.to_string().contains("[test-adapter]") && e.to_string().contains("limt"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
        let e = with(serde_json::json!({"limit": 0})).unwrap_err();
        assert!(e.to_string().contains("limit is 0"), "{e}");
        let found = lookup::<AdapterPlugin>("test-adapter").unwrap();
        assert_eq!(found.origin, "pool-core tests");
        assert!(found.doctor.is_none());
        assert_eq!(<AdapterPlugin as PluginRecord>::KIND, "adapter");
    }

    #[test]
    fn the_unknown_table_error_lists_the_adapters() {
        let mut c = PoolConfig::default();
        c.plugins
            .insert("test-adaptor".into(), serde_json::json!({"limit": 1}));
        let e = validate_plugin_tables(&c).unwrap_err();
        assert!(
            e.to_string().contains(
                "table [test-adaptor] belongs to no registered plugin; plugin tables \
                 available: test-adapter"
            ),
            "{e}"
        );
    }

    #[test]
    fn parse_table_names_the_table_and_the_key() {
        #[derive(serde::Deserialize, Default, Debug)]
        #[serde(deny_unknown_fields)]
        struct Opts {
            #[allow(dead_code)]
            thp: bool,
        }
        assert!(parse_table::<Opts>("anon", None).is_ok());
        let e = parse_table::<Opts>("anon", Some(&serde_json::json!({"thpp": true}))).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("[anon]") && msg.contains("thpp"), "{msg}");
    }
}
