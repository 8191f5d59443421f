//! Plugin records, collected with `inventory`, and lookup by name.
//!
//! A plugin crate submits a record at the top level of its `lib.rs`:
//!
//! ```
//! use pool_core::{Backing, BackingPlugin, Error, Result};
//!
//! fn build(_table: Option<&serde_json::Value>) -> Result<Box<dyn Backing>> {
//!     Err(Error::config("this example builds nothing"))
//! }
//!
//! pool_core::inventory::submit! {
//!     BackingPlugin {
//!         name: "example",
//!         summary: "an example record",
//!         origin: env!("CARGO_PKG_NAME"),
//!         build,
//!     }
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
//! The `auto` backing rule lives here and nowhere else: see [`select_backing`].

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::config::PoolConfig;
use crate::error::{Error, Result};
use crate::fs::{FsKind, filesystem_kind};
use crate::traits::{Backing, Pinner, Registrar};

/// Parses the plugin's own config table (`None` when the config has none)
/// into a configured plugin object. Must not create anything.
pub type BuildFn<T> = fn(Option<&Value>) -> Result<Box<T>>;

/// A backing plugin record.
#[derive(Debug)]
pub struct BackingPlugin {
    /// The name config and CLI select it by.
    pub name: &'static str,
    /// One line for `hostpool plugins`.
    pub summary: &'static str,
    /// The crate that submitted it (`env!("CARGO_PKG_NAME")`).
    pub origin: &'static str,
    /// Parse options and build.
    pub build: BuildFn<dyn Backing>,
}

/// A pinner plugin record.
#[derive(Debug)]
pub struct PinnerPlugin {
    /// The name config and CLI select it by.
    pub name: &'static str,
    /// One line for `hostpool plugins`.
    pub summary: &'static str,
    /// The crate that submitted it.
    pub origin: &'static str,
    /// Parse options and build.
    pub build: BuildFn<dyn Pinner>,
}

/// A registrar plugin record.
#[derive(Debug)]
pub struct RegistrarPlugin {
    /// The name config and CLI select it by.
    pub name: &'static str,
    /// One line for `hostpool plugins`.
    pub summary: &'static str,
    /// The crate that submitted it.
    pub origin: &'static str,
    /// Parse options and build.
    pub build: BuildFn<dyn Registrar>,
}

inventory::collect!(BackingPlugin);
inventory::collect!(PinnerPlugin);
inventory::collect!(RegistrarPlugin);

/// What the registry needs of a record.
pub trait PluginRecord: Sync + 'static {
    /// "backing", "pinner" or "registrar".
    const KIND: &'static str;
    /// The plugin's name.
    fn name(&self) -> &'static str;
    /// The crate that submitted it.
    fn origin(&self) -> &'static str;
    /// One line of description.
    fn summary(&self) -> &'static str;
    /// Every submitted record of this kind, in no particular order.
    fn all() -> Vec<&'static Self>;
}

macro_rules! record {
    ($t:ty, $kind:literal) => {
        impl PluginRecord for $t {
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
            fn all() -> Vec<&'static Self> {
                inventory::iter::<$t>.into_iter().collect()
            }
        }
    };
}
record!(BackingPlugin, "backing");
record!(PinnerPlugin, "pinner");
record!(RegistrarPlugin, "registrar");

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

/// The name `auto` resolves to for a config, and why. Pure apart from a
/// `statfs` of `dir`.
///
/// # Errors
/// [`Error::Config`] when `dir` cannot be examined or is on a filesystem no
/// backing serves.
pub fn auto_backing_name(dir: Option<&Path>) -> Result<(&'static str, String)> {
    let Some(dir) = dir else {
        return Ok((
            "anon",
            "backing = auto and no dir given: anonymous memory".into(),
        ));
    };
    match filesystem_kind(dir) {
        Ok(FsKind::Hugetlbfs { page_size }) => Ok((
            "hugetlbfs",
            format!(
                "backing = auto and {} is a hugetlbfs mount with {} pages",
                dir.display(),
                crate::layout::format_bytes(page_size)
            ),
        )),
        Ok(FsKind::Tmpfs) => Ok((
            "shm-segmented",
            format!(
                "backing = auto and {} is tmpfs: segmented shared-memory files",
                dir.display()
            ),
        )),
        Ok(FsKind::Other { magic }) => Err(Error::config(format!(
            "backing = auto cannot serve dir {}: it is neither hugetlbfs nor tmpfs (filesystem magic \
             {magic:#x}); mount hugetlbfs there (`mount -t hugetlbfs -o pagesize=1G none {}`), use \
             /dev/shm, or name a backing explicitly",
            dir.display(),
            dir.display()
        ))),
        Err(e) => Err(Error::config(format!(
            "cannot examine dir {}: {e}; create it, or mount hugetlbfs or tmpfs there",
            dir.display()
        ))),
    }
}

/// Resolve `config.backing` (including `auto`) to a registered record.
///
/// # Errors
/// As for [`auto_backing_name`] and [`lookup`].
pub fn select_backing(config: &PoolConfig) -> Result<BackingSelection> {
    let (name, reason) = if config.backing == "auto" {
        auto_backing_name(config.dir.as_deref())?
    } else {
        let name = lookup::<BackingPlugin>(&config.backing)?.name;
        (name, format!("backing = {name} was asked for"))
    };
    Ok(BackingSelection {
        plugin: lookup::<BackingPlugin>(name)?,
        reason,
    })
}

/// Parse every plugin table in the config with its own plugin, so a typo in
/// the table of a plugin that is not selected is still caught.
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
        } else {
            let mut all: Vec<&str> = names::<BackingPlugin>()?;
            all.extend(names::<PinnerPlugin>()?);
            all.extend(names::<RegistrarPlugin>()?);
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
        Box::leak(Box::new(BackingPlugin {
            name,
            summary: "test",
            origin,
            build,
        }))
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
    fn auto_without_dir_is_anon() {
        let (name, why) = auto_backing_name(None).unwrap();
        assert_eq!(name, "anon");
        assert!(why.contains("no dir"));
    }

    #[test]
    fn auto_on_tmpfs_is_shm_segmented_and_on_other_filesystems_an_error() {
        if let Ok(FsKind::Tmpfs) = filesystem_kind(Path::new("/dev/shm")) {
            assert_eq!(
                auto_backing_name(Some(Path::new("/dev/shm"))).unwrap().0,
                "shm-segmented"
            );
        } else {
            eprintln!("skip: /dev/shm is not tmpfs on this host");
        }
        let e = auto_backing_name(Some(Path::new("/proc"))).unwrap_err();
        assert!(e.to_string().contains("neither hugetlbfs nor tmpfs"), "{e}");
        let e = auto_backing_name(Some(Path::new("/nonexistent/dir"))).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot examine dir /nonexistent/dir"),
            "{e}"
        );
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
