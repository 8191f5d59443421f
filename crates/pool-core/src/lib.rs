//! `pool-core`: the core of hostpool, which plugins extend and engines embed.
//!
//! At the root, what an embedder uses: [`PoolConfig`] (TOML, JSON or built
//! in code) → [`PoolPlan`] (pure: plugins resolved, layout, capacity
//! verdicts, prefault threads) → [`Pool`] (map, prefault, pin, register) →
//! [`PoolReport`], torn down in reverse; [`Error`] says what went wrong and
//! how to fix it. The modules, each for one audience:
//!
//! - [`plugin`]: what a plugin implements and submits: the traits
//!   [`Backing`], [`Pinner`], [`Registrar`], their records collected with
//!   `inventory` (with the `auto` claim, cost figures and doctor hook each
//!   plugin owns), the registry, and the doctor's finding types;
//! - [`host`]: facts about this node that several plugins read, each read in
//!   one place: filesystems and the mount table, memory and cgroup limits,
//!   the memlock bound, NUMA topology;
//! - [`file`](mod@file): the mechanisms every file backing shares (private and
//!   exclusive files, memfds, files stitched into one mapping);
//! - [`layout`]: the pure layout math; [`prefault`]: the prefault engine;
//!   [`shared`]: pools shared by the ranks of one engine; [`gc`];
//! - [`sys`]: the system calls, the only `unsafe` in this crate, and
//!   [`Region`], the borrowed view of live pool memory;
//! - `conformance` (feature `conformance`): the suite every backing runs.

mod background;
mod choice;
mod config;
mod error;
mod pool;
mod size;

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod failpoint;
pub mod file;
pub mod gc;
pub mod host;
pub mod interrupt;
pub mod layout;
pub mod plugin;
pub mod prefault;
pub mod shared;
pub mod sys;

pub use background::{DEFAULT_CHUNK as DEFAULT_BACKGROUND_CHUNK, PinProgress, PinStatus};
pub use choice::{Choice, ChoiceError};
pub use config::{
    DEFAULT_ATTACH_TIMEOUT_SECS, DEFAULT_BARRIER_TIMEOUT_SECS, Format, HISPARSE_KEYS,
    MAX_ATTACH_TIMEOUT_SECS, PIN_OFF, POOL_KEYS, PinConfig, PinScope, PoolConfig, PrefaultChoice,
    Rendezvous, SharingConfig, pin_kind_from,
};
pub use error::{Context, Error, Result, TeardownIssue};
pub use layout::{Extent, MappedSize, PageSize};
pub use plugin::{
    Backing, BackingPlan, BackingPlugin, Mapping, Pin, Pinner, PinnerPlugin, RankBarrier,
    Registrar, RegistrarPlugin, Registration,
};
pub use pool::{
    NUMA_SAMPLES, Observer, Phase, Phases, PinPlanReport, PinReport, PlanReport, Pool, PoolPlan,
    PoolReport, PrefaultPlanReport, Quiet, RegistrationReport,
};
pub use size::{ByteSize, SizeError};
pub use sys::{Region, Span};

/// Re-exported so plugin crates submit records with the same `inventory`.
pub use inventory;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// `crate::X` references of each top-level module's sources.
    fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
        fn walk(dir: &Path, top: Option<&str>, graph: &mut BTreeMap<String, BTreeSet<String>>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    walk(&path, Some(top.unwrap_or(&name)), graph);
                    continue;
                }
                let module = top.map_or(name.clone(), str::to_string);
                if module == "lib" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let deps = graph.entry(module.clone()).or_default();
                for (i, _) in text.match_indices("crate::") {
                    let dep: String = text[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !dep.is_empty() && dep != module {
                        deps.insert(dep);
                    }
                }
            }
        }
        let mut graph = BTreeMap::new();
        walk(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            None,
            &mut graph,
        );
        graph
    }

    /// A cycle through `from`, if the graph has one.
    fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        fn visit(
            node: &str,
            graph: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|n| n == node) {
                let mut c = path[at..].to_vec();
                c.push(node.to_string());
                return Some(c);
            }
            if !done.insert(node.to_string()) {
                return None;
            }
            path.push(node.to_string());
            for dep in graph.get(node).into_iter().flatten() {
                if let Some(c) = visit(dep, graph, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            None
        }
        let mut done = BTreeSet::new();
        graph
            .keys()
            .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
    }

    #[test]
    fn the_modules_depend_on_each_other_without_cycles() {
        let graph = module_graph();
        assert!(
            graph.contains_key("plugin") && graph.contains_key("host"),
            "{graph:?}"
        );
        assert_eq!(cycle(&graph), None, "module graph: {graph:#?}");
        // The check itself finds a cycle when there is one.
        let mut bad = graph.clone();
        bad.entry("layout".into())
            .or_default()
            .insert("pool".into());
        assert!(cycle(&bad).is_some());
    }
}
