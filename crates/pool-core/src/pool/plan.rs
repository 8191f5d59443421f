//! [`PoolPlan`]: everything a build will do, resolved from the config
//! without creating, mapping or reserving anything, and its report.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::report::{HugePagesReport, PinPlanReport, PlanReport, PrefaultPlanReport};
pub use super::source::{LeasePlan, Memory, PinPlan, PoolPlan, Share, Source};
use crate::config::{PoolConfig, SharingConfig};
use crate::error::Result;
use crate::host::capacity;
use crate::layout::{Extent, MAX_POOL_BYTES, format_bytes};
use crate::plugin::{
    self, BackingPlan, ExtentReport, PinContext, Pinner, PinnerPlugin, Registrar, RegistrarPlugin,
};
use crate::prefault::{self, FaultIn, PrefaultPlan};

/// A backing, configured and planned.
type Planned = (
    plugin::BackingSelection,
    Box<dyn plugin::Backing>,
    crate::plugin::BackingPlan,
);

/// A backing planned, with what `huge_pages` got, and under `prefer` the
/// other page size it could have got.
type Chosen = (
    plugin::BackingSelection,
    Box<dyn plugin::Backing>,
    crate::plugin::BackingPlan,
    Option<HugePagesReport>,
    Option<u64>,
);

fn plan_with(config: &PoolConfig, shared: bool) -> Result<Planned> {
    let selection = plugin::select_backing(config, shared)?;
    let backing = (selection.plugin.build)(config.plugin_table(selection.plugin.name))?;
    let plan = backing.plan(config)?;
    Ok((selection, backing, plan))
}

/// The backing and its plan, under the pool's `huge_pages` policy (for
/// `backing = "auto"`): `required` refuses base pages, `off` refuses a
/// hugetlbfs dir, `prefer` falls back to base pages (segmented `/dev/shm`
/// for a shared pool, anonymous memory otherwise, as `auto` picks without a
/// dir) when the huge page backing's plan cannot hold the pool: a capacity
/// check short, or no huge pages to be had. The choice is made here, from the
/// plan's own capacity figures, so `plan` shows what `alloc` does.
fn choose_backing(config: &PoolConfig, backing_config: PoolConfig, shared: bool) -> Result<Chosen> {
    use crate::config::HugePages;
    use crate::host::capacity::Verdict;
    let Some(policy) = backing_config.huge_pages else {
        let (s, b, p) = plan_with(&backing_config, shared)?;
        return Ok((s, b, p, None, None));
    };
    let asked = crate::choice::Choice::name(policy);
    if config.backing != "auto" {
        return Err(crate::Error::config(format!(
            "huge_pages = \"{asked}\" chooses the backing, so it needs backing = \"auto\" (not \
             `{}`); drop one of them",
            config.backing
        )));
    }
    let base = crate::sys::base_page_size() as u64;
    let report = |plan: &crate::plugin::BackingPlan, reason: String, fell_back: bool| {
        Some(HugePagesReport {
            asked,
            got: crate::layout::format_bytes(plan.size.page().get()),
            page_size: plan.size.page().get(),
            reason,
            fell_back,
        })
    };
    if policy == HugePages::Off {
        if let Some(dir) = &backing_config.dir
            && let Ok(crate::host::fs::FsKind::Hugetlbfs { .. }) =
                crate::host::fs::filesystem_kind(dir)
        {
            return Err(crate::Error::config(format!(
                "huge_pages = \"off\" with dir {}, a hugetlbfs mount: give a tmpfs dir or none, \
                 or drop huge_pages",
                dir.display()
            )));
        }
        let (s, b, p) = plan_with(&backing_config, shared)?;
        let r = report(&p, "huge_pages = off: base pages".into(), false);
        return Ok((s, b, p, r, None));
    }
    let first = plan_with(&backing_config, shared);
    let short = |p: &crate::plugin::BackingPlan| {
        p.capacity
            .iter()
            .filter(|c| c.verdict == Verdict::Short)
            .map(|c| {
                format!(
                    "{} needs {}, {} free",
                    c.resource,
                    crate::layout::format_bytes(c.need),
                    c.free
                        .map_or_else(|| "?".to_string(), crate::layout::format_bytes)
                )
            })
            .collect::<Vec<_>>()
    };
    match (policy, first) {
        (HugePages::Required, Ok((s, b, p))) => {
            if p.size.page().get() == base {
                return Err(crate::Error::config(format!(
                    "huge_pages = \"required\", but backing {} maps {} pages here{}: give a \
                     hugetlbfs dir or none (a memfd of huge pages), or use huge_pages = \
                     \"prefer\"",
                    p.backing,
                    crate::layout::format_bytes(base),
                    backing_config
                        .dir
                        .as_ref()
                        .map(|d| format!(" (dir {})", d.display()))
                        .unwrap_or_default()
                )));
            }
            let r = report(
                &p,
                "huge_pages = required: a shortage is the capacity error".into(),
                false,
            );
            Ok((s, b, p, r, None))
        }
        (HugePages::Required, Err(e)) => Err(e),
        (_, first) => {
            let why_not = match &first {
                Ok((_, _, p)) if p.size.page().get() == base => None,
                Ok((_, _, p)) => {
                    let short = short(p);
                    (!short.is_empty()).then(|| short.join("; "))
                }
                Err(e) => Some(e.to_string()),
            };
            match (why_not, first) {
                (None, Ok((s, b, p))) => {
                    let reason = if p.size.page().get() == base {
                        format!("backing {} has base pages only", p.backing)
                    } else {
                        "the huge page pool holds it".to_string()
                    };
                    let r = report(&p, reason, false);
                    let other = (p.size.page().get() != base).then_some(base);
                    Ok((s, b, p, r, other))
                }
                (why, first) => {
                    let other = first
                        .ok()
                        .map(|(_, _, p)| p.size.page().get())
                        .filter(|&page| page != base);
                    let why = why.unwrap_or_default();
                    let fallback = PoolConfig {
                        dir: None,
                        page_size: None,
                        huge_pages: Some(HugePages::Off),
                        ..backing_config
                    };
                    let (s, b, p) = plan_with(&fallback, shared)?;
                    let r = report(
                        &p,
                        format!(
                            "huge pages cannot hold the pool ({why}): {} pages instead",
                            crate::layout::format_bytes(p.size.page().get())
                        ),
                        true,
                    );
                    Ok((s, b, p, r, other))
                }
            }
        }
    }
}

impl PoolPlan {
    /// The config the plan was made from (for the caller: the build reads
    /// none of it).
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Where the memory comes from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The memory a backing plans for this process (the creator's in a
    /// shared pool); `None` for a lease, whose memory is the keeper's.
    pub fn memory(&self) -> Option<&Memory> {
        self.source.memory()
    }

    /// What the backing will map; `None` for a lease.
    pub fn backing_plan(&self) -> Option<&BackingPlan> {
        self.memory().map(|m| &m.plan)
    }

    /// The extents of a kept pool's files, one file each, in pool order
    /// (empty for a plan that maps no files).
    pub fn kept_extents(&self) -> Vec<crate::Extent> {
        match self.backing_plan().map(|bp| &bp.source) {
            Some(crate::plugin::MemorySource::Files(fp)) => fp.extents.clone(),
            _ => Vec::new(),
        }
    }

    /// How the pool will be prefaulted (this rank's shard of a shared pool;
    /// nothing for a lease, whose memory comes resident).
    pub fn prefault(&self) -> &PrefaultPlan {
        &self.prefault
    }

    /// What pinning will do, when a pinner is asked for.
    pub fn pin(&self) -> Option<&PinPlan> {
        self.pin.as_ref()
    }

    /// The pinner, when one is asked for.
    pub fn pinner(&self) -> Option<&dyn Pinner> {
        self.pin.as_ref().map(|p| &*p.pinner)
    }

    /// The registrars, in order.
    pub fn registrars(&self) -> &[Box<dyn Registrar>] {
        &self.registrars
    }

    /// What pinners and registrars are told (block, memlock policy).
    pub fn context(&self) -> &PinContext {
        &self.context
    }

    /// What `huge_pages` asked for and what the pool gets, when it asked.
    pub fn huge_pages(&self) -> Option<&HugePagesReport> {
        self.memory().and_then(|m| m.huge_pages.as_ref())
    }

    /// What `numa_node` asked for and the node this process binds, when it
    /// asked.
    pub fn numa(&self) -> Option<&super::numa::NumaPlan> {
        self.numa.as_ref()
    }

    /// The ranks this process is one of (a shared pool's, or those sharing
    /// a lease).
    pub fn ranks(&self) -> Option<&SharingConfig> {
        self.source.ranks()
    }
}

impl PoolPlan {
    /// Resolve a config: plugins, sizes, capacity checks and prefault; for a
    /// lease (`[lease]`), what to ask the keeper and, with `fallback =
    /// "build"`, the plan to build when none answers.
    ///
    /// # Errors
    /// Configuration errors (unknown plugins or tables, bad sizes, settings a
    /// backing cannot honour, a bad `[lease]` table). Capacity shortfalls are
    /// *not* errors here: they are verdicts in the plan, and
    /// [`Pool::build`](crate::Pool::build) refuses them.
    pub fn new(config: PoolConfig) -> Result<PoolPlan> {
        PoolPlan::resolve(config, false)
    }

    /// The plan of a keeper's own pool (`hostpool keep`): files that another
    /// process can be handed (`auto` picks a backing of files, and a backing
    /// of memory of its own is refused), mapped and prefaulted by the
    /// keeper, pinned and registered by none of it.
    ///
    /// # Errors
    /// As for [`PoolPlan::new`], and [`crate::Error::Config`] for a backing
    /// that maps memory of its own.
    pub fn kept(config: PoolConfig) -> Result<PoolPlan> {
        if config.sharing.is_some() || config.lease.is_some() {
            return Err(crate::Error::config(
                "a kept pool is shared by leasing it: drop `sharing` and `[lease]` from a \
                 keeper's pool",
            ));
        }
        if config.pin.is_on() || !config.register.is_empty() {
            return Err(crate::Error::config(
                "pins and registrations of a kept pool belong to the process that uses the \
                 memory: drop `pin` and `register` from a keeper's pool",
            ));
        }
        PoolPlan::resolve(config, true)
    }

    fn resolve(config: PoolConfig, kept: bool) -> Result<PoolPlan> {
        check_size(&config)?;
        check_dir(&config)?;
        plugin::validate_plugin_tables(&config)?;
        if let Some(sharing) = &config.sharing {
            sharing.validate()?;
        }
        let keeper = match &config.lease {
            Some(lease) => Some(lease.validate(config.sharing.as_ref())?.to_string()),
            None => None,
        };
        let numa = super::numa::resolve(&config)?;
        let (pin, context) = pin_plan(&config)?;
        let registrars = config
            .register
            .iter()
            .map(|name| {
                let r = plugin::lookup::<RegistrarPlugin>(name)?;
                (r.build)(config.plugin_table(r.name))
            })
            .collect::<Result<Vec<_>>>()?;
        let (source, prefault) = match (keeper, &config.lease) {
            (Some(keeper), Some(lease)) => lease_source(&config, keeper, lease)?,
            _ => memory_source(&config, kept, numa.as_ref())?,
        };
        Ok(PoolPlan {
            config,
            source,
            prefault,
            pin,
            registrars,
            context,
            numa,
        })
    }

    /// The plan of a shared pool's joiner whose `huge_pages = "prefer"`
    /// could have chosen other pages than it did: with `page` size (huge
    /// pages, or base pages without a dir), the creator's choice.
    ///
    /// # Errors
    /// As for [`PoolPlan::new`].
    fn with_creators_pages(config: &PoolConfig, page: u64) -> Result<PoolPlan> {
        use crate::config::HugePages;
        let base = crate::sys::base_page_size() as u64;
        let config = if page == base {
            PoolConfig {
                dir: None,
                page_size: None,
                huge_pages: Some(HugePages::Off),
                ..config.clone()
            }
        } else {
            PoolConfig {
                page_size: Some(crate::size::ByteSize(page)),
                huge_pages: Some(HugePages::Required),
                ..config.clone()
            }
        };
        let mut plan = PoolPlan::new(config)?;
        let got = crate::layout::format_bytes(page);
        if let Source::Shared(share) = &mut plan.source {
            share.memory.huge_pages = Some(HugePagesReport {
                asked: "prefer",
                reason: format!(
                    "the shared pool's creator has {got} pages: every rank takes its choice"
                ),
                got,
                page_size: page,
                fell_back: page == base,
            });
        }
        Ok(plan)
    }

    /// The plan a joiner builds when its shared pool's creator has `page`
    /// pages (`huge_pages = "prefer"` chose the other size), when it has one.
    pub(crate) fn creators_pages(&self, page: u64) -> Option<&PoolPlan> {
        let Source::Shared(share) = &self.source else {
            return None;
        };
        share.creators_pages.as_deref().filter(|p| {
            p.backing_plan()
                .is_some_and(|b| b.size.page().get() == page)
        })
    }

    /// The plan as a serializable report (`hostpool plan --json`).
    pub fn report(&self) -> PlanReport {
        let mut explain = Vec::new();
        match &self.source {
            Source::Leased(l) => {
                explain.push(format!(
                    "leased from keeper `{}`: its backing and pages{}; this process maps, pins \
                     and registers it",
                    l.keeper,
                    l.size
                        .map(|s| format!(", which must be {}", format_bytes(s)))
                        .unwrap_or_default()
                ));
                if let Some(f) = &l.fallback {
                    explain.push("when no keeper answers (fallback = build), this plan:".into());
                    explain.extend(
                        f.report()
                            .explain
                            .into_iter()
                            .map(|l| format!("fallback: {l}")),
                    );
                }
            }
            _ => {
                if let Some(m) = self.memory() {
                    explain.push(m.reason.clone());
                    explain.extend(m.plan.explain.iter().cloned());
                }
            }
        }
        explain.extend(self.prefault.explain.iter().cloned());
        explain.push(match &self.pin {
            Some(p) => format!(
                "pin with {} ({})",
                p.pinner.name(),
                if p.required {
                    "required"
                } else {
                    "best effort"
                }
            ),
            None => "no pinning (pin kind off)".to_string(),
        });
        for r in &self.registrars {
            explain.push(format!("register with {}", r.name()));
        }
        if let Some(h) = self.huge_pages() {
            explain.push(format!(
                "huge_pages = {}: {} pages ({})",
                h.asked, h.got, h.reason
            ));
        }
        if let Some(numa) = &self.numa {
            explain.push(super::numa::explain(
                numa,
                self.prefault.extent,
                self.ranks().is_some(),
            ));
        }
        let capacity = self
            .backing_plan()
            .map(|bp| bp.capacity.clone())
            .unwrap_or_default();
        for c in &capacity {
            explain.push(format!(
                "capacity {}: need {}, free {} ({}): {:?}",
                c.resource,
                format_bytes(c.need),
                c.free.map_or("unknown".to_string(), format_bytes),
                c.source,
                c.verdict
            ));
        }
        let pin_plan = match (&self.pin, self.backing_plan()) {
            (Some(p), Some(bp)) => p.pinner.plan(bp.size, &self.context),
            _ => Value::Null,
        };
        let registration_plans = match self.backing_plan() {
            Some(bp) => self
                .registrars
                .iter()
                .map(|r| serde_json::json!({"kind": r.name(), "plan": r.plan(bp.size, &self.context)}))
                .collect(),
            None => Vec::new(),
        };
        let (shards, predicted) = match self.backing_plan() {
            Some(bp) => {
                let predicted = self.predict(bp);
                explain.push(format!(
                    "predicted: prefault {:.1} s{}{} ({})",
                    predicted.prefault,
                    predicted
                        .pin
                        .map(|p| format!(", pin {p:.1} s"))
                        .unwrap_or_default(),
                    predicted
                        .register
                        .map(|r| format!(", register {r:.1} s"))
                        .unwrap_or_default(),
                    predicted.basis
                ));
                (self.shards(bp), predicted)
            }
            None => (
                Vec::new(),
                crate::plugin::Predicted {
                    prefault: 0.0,
                    pin: None,
                    register: None,
                    basis: "leased: the keeper's pool comes resident",
                },
            ),
        };
        let (backing, page_size, logical, mapped, segments, files, options) =
            match (&self.source, self.backing_plan()) {
                (_, Some(bp)) => (
                    bp.backing.to_string(),
                    bp.size.page().get(),
                    bp.size.logical(),
                    bp.size.mapped(),
                    super::report::segment_reports(bp),
                    bp.files.iter().map(|p| p.display().to_string()).collect(),
                    bp.options.clone(),
                ),
                (Source::Leased(l), None) => (
                    "keeper".to_string(),
                    l.page.unwrap_or(0),
                    l.size.unwrap_or(0),
                    0,
                    Vec::new(),
                    Vec::new(),
                    serde_json::json!({"keeper": l.keeper}),
                ),
                (_, None) => (String::new(), 0, 0, 0, Vec::new(), Vec::new(), Value::Null),
            };
        PlanReport {
            version: crate::VERSION,
            huge_pages: self.huge_pages().cloned(),
            numa: self.numa.clone(),
            shards,
            pin_plan,
            registration_plans,
            predicted_seconds: predicted,
            backing,
            page_size,
            logical_bytes: logical,
            mapped_bytes: mapped,
            segments,
            files,
            options,
            prefault: PrefaultPlanReport {
                method: self.prefault.method.name(),
                threads: self.prefault.threads,
                offset: self.prefault.extent.offset,
                bytes: self.prefault.extent.len,
            },
            pin: PinPlanReport {
                kind: self.config.pin.kind_name().to_string(),
                required: self.config.pin.required,
            },
            registrations: self
                .registrars
                .iter()
                .map(|r| r.name().to_string())
                .collect(),
            fits: capacity
                .iter()
                .all(|c| c.verdict != capacity::Verdict::Short),
            capacity,
            keeper: match &self.source {
                Source::Leased(l) => Some(l.keeper.clone()),
                _ => None,
            },
            explain,
        }
    }

    /// Prefault shards: one per rank of a shared pool, else one per thread.
    fn shards(&self, bp: &BackingPlan) -> Vec<ExtentReport> {
        let size = bp.size;
        let shards = match self.ranks() {
            Some(s) => crate::layout::shards(size.mapped(), size.page(), s.world),
            None => crate::layout::shards(
                size.page().round_down(self.prefault.extent.len),
                size.page(),
                u32::try_from(self.prefault.threads).unwrap_or(1),
            ),
        };
        shards
            .map(|v| v.into_iter().map(ExtentReport::from).collect())
            .unwrap_or_default()
    }

    /// Seconds each phase is predicted to take, from the plugins' figures.
    fn predict(&self, bp: &BackingPlan) -> crate::plugin::Predicted {
        let prefault_cost = plugin::lookup::<plugin::BackingPlugin>(bp.backing)
            .ok()
            .and_then(|r| r.cost)
            .unwrap_or(plugin::PrefaultCost::DEFAULT);
        crate::plugin::predict(
            bp.size,
            &crate::plugin::CostInputs {
                prefault: prefault_cost,
                prefault_bytes: self.prefault.extent.len,
                threads: self.prefault.threads,
                pin: self
                    .pin
                    .as_ref()
                    .and_then(|p| plugin::lookup::<PinnerPlugin>(p.pinner.name()).ok())
                    .and_then(|r| r.cost),
                registrars: self
                    .registrars
                    .iter()
                    .filter_map(|r| plugin::lookup::<RegistrarPlugin>(r.name()).ok())
                    .filter_map(|r| r.cost)
                    .collect(),
            },
        )
    }
}

/// A lease's source: what to ask the keeper, and the plan to build when
/// none answers; and its prefault, none (leased memory comes resident).
fn lease_source(
    config: &PoolConfig,
    keeper: String,
    lease: &crate::config::LeaseConfig,
) -> Result<(Source, PrefaultPlan)> {
    // The fallback is the plan of this config without its lease.
    let fallback = match lease.fallback {
        crate::config::KeeperFallback::Build => Some(Box::new(PoolPlan::new(PoolConfig {
            lease: None,
            ..config.clone()
        })?)),
        crate::config::KeeperFallback::Fail => None,
    };
    let sharing = config.sharing.clone();
    let source = Source::Leased(LeasePlan {
        keeper,
        attach_timeout_secs: lease.attach_timeout(sharing.as_ref()),
        barrier_timeout_secs: sharing
            .as_ref()
            .map_or(crate::DEFAULT_BARRIER_TIMEOUT_SECS, |s| {
                s.barrier_timeout_secs
            }),
        ranks: sharing,
        companion_of: lease.companion_of.clone(),
        tag: lease.tag.clone(),
        size: lease.size.map(crate::ByteSize::get),
        page: config.page_size.map(crate::ByteSize::get),
        fallback,
    });
    // Leased memory comes resident: nothing to fault.
    let prefault = PrefaultPlan {
        method: prefault::NoPrefault.into(),
        threads: 0,
        extent: Extent { offset: 0, len: 0 },
        explain: vec!["leased memory comes resident: no prefault".into()],
    };
    Ok((source, prefault))
}

/// The source of memory a backing plans (own, shared, or a keeper's kept
/// files), and how this process prefaults it.
fn memory_source(
    config: &PoolConfig,
    kept: bool,
    numa: Option<&super::numa::NumaPlan>,
) -> Result<(Source, PrefaultPlan)> {
    // The backing sees the one node that holds the whole pool (and checks
    // that node's own capacity: free huge pages per node); where ranks
    // bind their shards to nodes of their own it sees what was asked, a
    // list or "gpu", which names no one node; without a node, nothing.
    let numa_node = numa.as_ref().filter(|p| p.node.is_some()).map(|p| {
        p.whole_pool_on()
            .map_or_else(|| p.asked.clone(), crate::config::NumaNode::Node)
    });
    let backing_config = PoolConfig {
        numa_node,
        ..config.clone()
    };
    let shared = kept || config.sharing.is_some();
    let (selection, backing, mut backing_plan, huge_pages, other_pages) =
        choose_backing(config, backing_config, shared)?;
    if let Some(block) = config.block_size {
        check_block(block.get(), backing_plan.size)?;
    }
    // A shared pool's rank faults only its own shard.
    let extent = match &config.sharing {
        // Validated above, before the NUMA nodes were read per rank.
        Some(sharing) => crate::shared::shard(backing_plan.size, sharing)?,
        None => Extent {
            offset: 0,
            len: backing_plan.size.mapped(),
        },
    };
    let prefault = prefault::plan(
        config.prefault,
        extent,
        backing_plan.size.page(),
        config.threads,
    )?;
    let files = match &backing_plan.source {
        crate::plugin::MemorySource::Files(files) => Some(files),
        crate::plugin::MemorySource::Own => None,
    };
    let source = match (&config.sharing, files) {
        (None, _) if kept && files.is_none() => {
            return Err(crate::Error::config(format!(
                "backing {} maps memory of its own, which a keeper cannot hand to another \
                 process; use a file backing (shm-segmented, hugetlbfs)",
                backing_plan.backing
            )));
        }
        (None, _) => {
            let memory = Memory {
                reason: selection.reason,
                backing,
                plan: backing_plan,
                huge_pages,
            };
            if kept {
                Source::Kept(memory)
            } else {
                Source::Own(memory)
            }
        }
        (Some(sharing), Some(files)) => {
            // A shared pool of files names them in the plan (the file
            // rendezvous's data files).
            let names = shared_names(files, sharing);
            if files.dir.is_some() {
                backing_plan.files = names.clone();
            }
            let creators_pages = match other_pages {
                Some(page) => PoolPlan::with_creators_pages(config, page)
                    .ok()
                    .map(Box::new),
                None => None,
            };
            Source::Shared(Share {
                memory: Memory {
                    reason: selection.reason,
                    backing,
                    plan: backing_plan,
                    huge_pages,
                },
                sharing: sharing.clone(),
                files: names,
                creators_pages,
            })
        }
        (Some(sharing), None) => {
            return Err(crate::Error::config(format!(
                "backing {} cannot be shared between processes (shared pool `{}`): its \
                 memory has no name another rank could open, and each rank would get a \
                 private pool of its own; drop --backing {} (auto then picks segmented \
                 files in /dev/shm), or give --dir /dev/shm or a hugetlbfs mount",
                backing_plan.backing, sharing.name, backing_plan.backing
            )));
        }
    };
    Ok((source, prefault))
}

/// The pinning a config asks for, and what pinners and registrars are told.
fn pin_plan(config: &PoolConfig) -> Result<(Option<PinPlan>, PinContext)> {
    let pin = &config.pin;
    if pin.background_chunk.is_some_and(|c| c.get() == 0) {
        return Err(crate::Error::config(
            "pin.background_chunk is 0; give a size such as \"256MiB\", or leave it out",
        ));
    }
    let plan = match &pin.kind {
        Some(kind) => {
            let p = plugin::lookup::<PinnerPlugin>(kind)?;
            Some(PinPlan {
                pinner: Arc::from((p.build)(config.plugin_table(p.name))?),
                required: pin.required,
                scope: pin.scope,
                background_chunk: pin.background.then(|| {
                    pin.background_chunk
                        .map_or(crate::DEFAULT_BACKGROUND_CHUNK, crate::ByteSize::get)
                }),
                chunk_asked: pin.background_chunk.is_some(),
            })
        }
        None if pin.background => {
            return Err(crate::Error::config(
                "background pinning needs a pinner: set pin.kind (--pin cuda or --pin mlock)",
            ));
        }
        None => None,
    };
    Ok((
        plan,
        PinContext::new(
            config.block_size.map(crate::ByteSize::get),
            pin.memlock_bound,
        ),
    ))
}

/// `dir`, where it exists, must be a directory: a file or a device there
/// (`--dir /dev/null`, whose devtmpfs passes for tmpfs) is bad input, not a
/// failed `open`. A missing dir is left to the backings, which say how to
/// make the one they serve.
fn check_dir(config: &PoolConfig) -> Result<()> {
    let Some(dir) = &config.dir else {
        return Ok(());
    };
    let Ok(meta) = std::fs::metadata(dir) else {
        return Ok(());
    };
    if meta.is_dir() {
        return Ok(());
    }
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let kind = if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a file"
    };
    Err(crate::Error::config(format!(
        "dir {} is not a directory (it is {kind}); give the directory the pool's files are to \
         be made in",
        dir.display()
    )))
}

/// A pool larger than [`MAX_POOL_BYTES`] is a configuration error that names
/// the limit.
fn check_size(config: &PoolConfig) -> Result<()> {
    let size = config.size.get();
    if size > MAX_POOL_BYTES {
        return Err(crate::Error::config(format!(
            "size = {} ({size} bytes) is more than the {} a pool can have (the user address space \
             of x86-64 with 5-level page tables); ask for at most {} (--size {})",
            format_bytes(size),
            format_bytes(MAX_POOL_BYTES),
            format_bytes(MAX_POOL_BYTES),
            format_bytes(MAX_POOL_BYTES).replace(' ', "")
        )));
    }
    Ok(())
}

/// The caller's block is any positive number of bytes (an engine's copy unit:
/// vLLM's 61 × 512 B, SGLang's 300 MiB pages). Registration chunks (CUDA
/// chunks, RDMA and NIXL regions, background pin chunks) are cut on
/// multiples of `lcm(block_size, page size)`, which is page-aligned and never
/// splits a block, so that unit must fit in the pool; a zero block, a unit
/// larger than the pool, or one that overflows 64 bits is a configuration
/// error. Checked at plan time whatever the pin policy.
fn check_block(block: u64, size: crate::layout::MappedSize) -> Result<()> {
    let page = size.page();
    let pool = size.mapped();
    if block == 0 {
        return Err(crate::Error::config(format!(
            "block_size = 0 bytes is not a positive number of bytes, so there is no registration \
             unit lcm(block_size, page size) to cut the {} ({pool} bytes) pool of {page} pages \
             on; give the engine's block (its copy unit) in bytes, any positive size such as \
             31232 or 2MiB, or leave block_size out to use the page size",
            format_bytes(pool)
        )));
    }
    let too_big = |unit: String| {
        crate::Error::config(format!(
            "block_size = {} ({block} bytes) with the {page} ({} bytes) page size gives a \
             registration unit lcm(block_size, page size) = {unit}, more than the {} ({pool} \
             bytes) pool, and registration chunks are cut on multiples of that unit; give a \
             block_size whose lcm with the page size is at most the pool size (a smaller block, \
             or one with more factors of two in common with the page), or a larger pool",
            format_bytes(block),
            page.get(),
            format_bytes(pool)
        ))
    };
    match crate::layout::lcm(page.get(), block) {
        Ok(unit) if unit <= pool => Ok(()),
        Ok(unit) => Err(too_big(format!("{} ({unit} bytes)", format_bytes(unit)))),
        Err(_) => Err(too_big(
            "more than 16 EiB (it overflows a 64-bit byte count)".into(),
        )),
    }
}

/// The names a shared pool's data files have with the file rendezvous, one
/// per extent (empty paths for a pool with no directory, whose memory only
/// the socket passes).
fn shared_names(
    files: &crate::plugin::FilePlan,
    sharing: &crate::config::SharingConfig,
) -> Vec<PathBuf> {
    (0..files.extents.len())
        .map(|i| match &files.dir {
            Some(dir) => crate::gc::data_path(
                dir,
                &sharing.name,
                (files.indexed_names || files.extents.len() > 1).then_some(i),
            ),
            None => PathBuf::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{PageSize, round_to_page};
    use crate::size::ByteSize;

    #[test]
    fn a_zero_block_or_one_whose_lcm_with_the_page_exceeds_the_pool_is_a_usage_error() {
        let huge = round_to_page(4 << 30, PageSize::HUGE_1G).unwrap();
        let small = round_to_page(8 << 20, PageSize::BASE_4K).unwrap();
        let tiny = round_to_page(64 << 10, PageSize::BASE_4K).unwrap();
        // 31232 = 61 × 512 and 4096 = 8 × 512: the lcm is 61 × 4096.
        let vllm = 61 * 512;
        let vllm_unit = 61 * 4096;
        for (block, size, says) in [
            (
                0,
                small,
                vec![
                    "block_size = 0 bytes",
                    "not a positive number of bytes",
                    "lcm(block_size, page size)",
                    "4 KiB pages",
                    "8 MiB (8388608 bytes) pool",
                ],
            ),
            (
                vllm,
                tiny,
                vec![
                    "block_size = 30.50 KiB (31232 bytes)",
                    "4 KiB (4096 bytes) page size",
                    "lcm(block_size, page size) = 244 KiB (249856 bytes)",
                    "more than the 64 KiB (65536 bytes) pool",
                    "or a larger pool",
                ],
            ),
            (
                5 << 30,
                huge,
                vec![
                    "block_size = 5 GiB",
                    "1 GiB (1073741824 bytes) page size",
                    "= 5 GiB (5368709120 bytes)",
                    "more than the 4 GiB (4294967296 bytes) pool",
                ],
            ),
            (
                // Odd: 4097 GiB of unit for a 4 GiB pool.
                4097,
                huge,
                vec![
                    "(4097 bytes)",
                    "= 4.00 TiB (4399120252928 bytes)",
                    "4 GiB (4294967296 bytes) pool",
                ],
            ),
            (
                // Odd, so its lcm with a 1 GiB page overflows 64 bits.
                u64::MAX,
                huge,
                vec![
                    "18446744073709551615 bytes",
                    "1 GiB (1073741824 bytes) page size",
                    "more than 16 EiB",
                    "4 GiB (4294967296 bytes) pool",
                ],
            ),
        ] {
            let e = check_block(block, size).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
            let msg = e.to_string();
            for want in says {
                assert!(msg.contains(want), "{block}: wants {want:?}: {msg}");
            }
            assert!(!msg.contains("multiple of 4 KiB"), "the old rule: {msg}");
        }
        assert_eq!(crate::layout::lcm(4096, vllm), Ok(vllm_unit));
        for (block, size) in [
            (1, small),
            (1000, small),
            (vllm, small),
            (4096, small),
            (4097, round_to_page(32 << 20, PageSize::BASE_4K).unwrap()),
            (2 << 20, huge),
            (1 << 30, huge),
            (64 << 10, huge),
            (
                300 << 20,
                round_to_page(600 << 20, PageSize::HUGE_2M).unwrap(),
            ),
            // The unit exactly fills the pool.
            (vllm, round_to_page(vllm_unit, PageSize::BASE_4K).unwrap()),
        ] {
            check_block(block, size).unwrap_or_else(|e| panic!("{block}: {e}"));
        }
    }

    #[test]
    fn pools_beyond_the_address_space_name_the_limit() {
        let config = PoolConfig {
            size: ByteSize(u64::MAX),
            ..PoolConfig::default()
        };
        let e = check_size(&config).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(
            msg.contains("64 PiB") && !msg.contains("too large"),
            "{msg}"
        );
        let config = PoolConfig {
            size: ByteSize(MAX_POOL_BYTES),
            ..PoolConfig::default()
        };
        check_size(&config).unwrap();
    }
}
