//! `anon`: anonymous memory, the embedded default that works on any Linux box.
//!
//! `mmap(MAP_ANONYMOUS | MAP_PRIVATE)` by default; `shared = true` maps
//! `MAP_SHARED` (shared with children after `fork`); `thp = true` aligns the
//! start to the transparent-huge-page size and asks for huge pages with
//! `madvise(MADV_HUGEPAGE)`. Nothing is left behind: the kernel frees the
//! memory on `munmap` or when the process dies, however it dies.
//!
//! ```toml
//! backing = "anon"
//! [anon]
//! shared = false
//! thp = true
//! ```

#![forbid(unsafe_code)]

mod doctor;

use pool_core::host::{capacity, thp};
use pool_core::plugin::{AutoClaim, AutoQuery, PrefaultCost, parse_table};
use pool_core::plugin::{Backing, BackingPlan, BackingPlugin, Mapping, unmap_at_teardown};
use pool_core::{AnonMapOptions, Mmap, Placeholder};
use pool_core::{Context, Error, PoolConfig, Region, Result, TeardownIssue};
use pool_core::{PageSize, format_bytes, round_to_page};
use serde::{Deserialize, Serialize};

/// The plugin name.
pub const NAME: &str = "anon";

/// The `[anon]` table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnonOptions {
    /// `MAP_SHARED` instead of `MAP_PRIVATE`.
    #[serde(default)]
    pub shared: bool,
    /// Transparent huge pages (`MADV_HUGEPAGE`, start aligned to the THP size).
    #[serde(default)]
    pub thp: bool,
}

/// The configured backing.
#[derive(Debug, Clone, Copy)]
pub struct AnonBacking {
    options: AnonOptions,
}

fn build(table: Option<&serde_json::Value>) -> Result<Box<dyn Backing>> {
    Ok(Box::new(AnonBacking {
        options: parse_table(NAME, table)?,
    }))
}

inventory::submit! {
    BackingPlugin::new(
        NAME,
        "anonymous memory (MAP_PRIVATE, or MAP_SHARED with shared = true; THP with thp = true)",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_auto(claim, &[])
    .with_cost(PrefaultCost::DEFAULT)
    .with_doctor(doctor::findings)
}

/// `auto` without a `dir` is anonymous memory, for a private pool (its
/// memory has no name another process could open).
fn claim(q: &AutoQuery<'_>) -> Option<AutoClaim> {
    (q.dir.is_none() && !q.shared).then(|| AutoClaim::new(10, "no dir given: anonymous memory"))
}

/// The transparent huge page size (`hpage_pmd_size`), 2 MiB when unreadable.
fn thp_size() -> u64 {
    thp::pmd_size().unwrap_or(2 << 20)
}

impl AnonBacking {
    /// A backing with these options.
    pub fn new(options: AnonOptions) -> AnonBacking {
        AnonBacking { options }
    }
}

impl Backing for AnonBacking {
    fn name(&self) -> &'static str {
        NAME
    }

    fn plan(&self, config: &PoolConfig) -> Result<BackingPlan> {
        if let Some(dir) = &config.dir {
            return Err(Error::config(format!(
                "backing anon maps anonymous memory and takes no dir (got {}); drop dir, or use \
                 backing hugetlbfs or shm-segmented for a file-backed pool",
                dir.display()
            )));
        }
        let base = PageSize::new(pool_core::base_page_size() as u64)?;
        if let Some(asked) = config.page_size
            && asked.get() != base.get()
        {
            return Err(Error::config(format!(
                "backing anon maps {base} base pages, not the {} page_size asked for; for huge pages \
                 use backing hugetlbfs (reserved, guaranteed) or [anon] thp = true (transparent, best effort)",
                format_bytes(asked.get())
            )));
        }
        let size = round_to_page(config.size.get(), base)?;
        let mut explain = vec![format!(
            "anonymous {} mapping of {} ({} mapped in {base} pages)",
            if self.options.shared {
                "MAP_SHARED"
            } else {
                "MAP_PRIVATE"
            },
            format_bytes(size.logical()),
            format_bytes(size.mapped()),
        )];
        if self.options.thp {
            explain.push(format!(
                "thp: start aligned to {} and MADV_HUGEPAGE (system THP mode: {})",
                format_bytes(thp_size()),
                thp::mode().unwrap_or_else(|| "unknown".into())
            ));
            if thp::mode().as_deref() == Some("never") {
                explain.push(
                    "warning: THP is disabled system-wide (never); thp = true has no effect".into(),
                );
            }
        }
        let mut plan = BackingPlan::new(NAME, size);
        plan.capacity = capacity::ordinary_memory(size.mapped());
        plan.options = serde_json::to_value(self.options).unwrap_or_default();
        plan.explain = explain;
        plan.transparent_huge_pages = self.options.thp;
        Ok(plan)
    }

    fn map(&self, plan: &BackingPlan) -> Result<Box<dyn Mapping>> {
        let align = if self.options.thp {
            usize::try_from(thp_size()).unwrap_or(2 << 20)
        } else {
            pool_core::base_page_size()
        };
        let mapped = match pool_core::failpoint::check("anon-mmap") {
            Some(e) => Err(e),
            None => Mmap::anonymous(
                plan.size,
                AnonMapOptions {
                    shared: self.options.shared,
                    align,
                },
            ),
        };
        let mmap = mapped.map_err(|source| {
            Error::os(
                "mmap(MAP_ANONYMOUS)",
                source,
                Context::new(plan.size.mapped(), plan.size.page()).remedy(
                    "the kernel refused the size (overcommit policy or address space); free \
                     memory, check vm.overcommit_memory, or ask for a smaller --size",
                ),
            )
        })?;
        if self.options.thp
            && let Err(e) = mmap.region().advise_hugepage()
        {
            tracing::warn!("MADV_HUGEPAGE failed ({e}); the pool uses base pages");
        }
        Ok(Box::new(AnonMapping { mmap }))
    }
}

/// A live anonymous mapping.
#[derive(Debug)]
struct AnonMapping {
    mmap: Mmap,
}

impl Mapping for AnonMapping {
    fn region(&self) -> Region<'_> {
        self.mmap.region()
    }

    fn teardown(self: Box<Self>) -> Vec<TeardownIssue> {
        unmap_at_teardown(self.mmap, false).0
    }

    fn teardown_keeping_range(self: Box<Self>) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        unmap_at_teardown(self.mmap, true)
    }
}

#[cfg(test)]
mod tests {
    use pool_core::conformance::{self, BadConfig, Suite};
    use pool_core::{ByteSize, Pool, PoolPlan, Quiet};
    use serde_json::json;

    use super::*;

    fn config(size: u64, table: Option<serde_json::Value>) -> PoolConfig {
        let mut c = PoolConfig {
            size: ByteSize(size),
            backing: NAME.into(),
            ..PoolConfig::default()
        };
        if let Some(t) = table {
            c.plugins.insert(NAME.into(), t);
        }
        c
    }

    #[test]
    fn anon_passes_the_conformance_suite() {
        let bad = vec![
            BadConfig {
                config: config(4 << 20, Some(json!({"thpp": true}))),
                expect: "unknown field `thpp`",
            },
            BadConfig {
                config: PoolConfig {
                    dir: Some("/dev/shm".into()),
                    ..config(4 << 20, None)
                },
                expect: "takes no dir",
            },
            BadConfig {
                config: PoolConfig {
                    page_size: Some(ByteSize::mib(2)),
                    ..config(4 << 20, None)
                },
                expect: "use backing hugetlbfs",
            },
            BadConfig {
                config: config(0, None),
                expect: "zero",
            },
            BadConfig {
                config: config(100 << 40, None),
                expect: "cannot hold the pool",
            },
            BadConfig {
                config: PoolConfig {
                    numa_node: Some(pool_core::NumaNode::Node(63)),
                    ..config(4 << 20, None)
                },
                expect: "NUMA node 63 does not exist",
            },
        ];
        let suite = Suite {
            good: vec![
                config(64 << 20, None),
                config((64 << 20) + 12345, Some(json!({"shared": true}))),
                config(40 << 20, Some(json!({"thp": true}))),
                config(4096, Some(json!({"shared": true, "thp": true}))),
                PoolConfig {
                    numa_node: Some(pool_core::NumaNode::Node(0)),
                    ..config(16 << 20, None)
                },
            ],
            bad,
            populates_at_map: false,
        };
        let failures = conformance::run(&suite);
        assert!(
            failures.is_empty(),
            "conformance failures:\n{}",
            failures
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[test]
    fn auto_without_dir_selects_anon() {
        let plan = PoolPlan::new(PoolConfig::default()).unwrap();
        assert_eq!(plan.backing_plan().unwrap().backing, NAME);
        assert!(plan.report().explain[0].contains("no dir"));
    }

    #[test]
    fn a_numa_bound_pool_reports_its_placement() {
        let c = PoolConfig {
            numa_node: Some(pool_core::NumaNode::Node(0)),
            ..config(32 << 20, None)
        };
        let pool = Pool::build(&PoolPlan::new(c).unwrap(), &Quiet).unwrap();
        let numa = pool.report().numa.clone().unwrap();
        assert_eq!(numa.plan.node, Some(0));
        assert!(numa.bound, "{numa:?}");
        assert!(numa.shards.is_empty(), "a private pool has no shards");
        assert!(
            numa.sampled >= 2 && numa.on_node == numa.sampled,
            "{numa:?}"
        );
        drop(pool);
    }

    #[test]
    fn thp_pool_starts_on_a_thp_boundary() {
        let pool = Pool::build(
            &PoolPlan::new(config(8 << 20, Some(json!({"thp": true})))).unwrap(),
            &Quiet,
        )
        .unwrap();
        let addr = pool.region().unwrap().addr() as u64;
        assert_eq!(addr % thp_size(), 0, "thp pool at {addr:#x}");
        assert_eq!(pool.report().options, json!({"shared": false, "thp": true}));
        assert!(pool.teardown().teardown_issues.is_empty());
    }

    /// Build a 1 MiB pool with this `[anon]` table, let a forked child
    /// write 0xab into it, and return the byte the parent then reads there.
    fn byte_after_a_child_writes(table: Option<serde_json::Value>) -> u8 {
        let pool = Pool::build(&PoolPlan::new(config(1 << 20, table)).unwrap(), &Quiet).unwrap();
        let region = pool.region().unwrap();
        pool_core::child_writes_byte(&region, 4096, 0xab).unwrap();
        let seen = region.read_byte(4096).unwrap();
        assert!(pool.teardown().teardown_issues.is_empty());
        seen
    }

    #[test]
    fn shared_pool_is_shared_with_a_forked_child() {
        assert_eq!(
            byte_after_a_child_writes(Some(json!({"shared": true}))),
            0xab,
            "the child's write must be visible"
        );
    }

    #[test]
    fn private_pool_is_not_shared_with_a_forked_child() {
        assert_eq!(
            byte_after_a_child_writes(None),
            0,
            "a private pool must not see the child's write"
        );
    }
}
