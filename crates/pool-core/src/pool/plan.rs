//! [`PoolPlan`]: everything a build will do, resolved from the config
//! without creating, mapping or reserving anything, and its report.

use std::path::PathBuf;

use serde_json::Value;

use super::report::{HugePagesReport, PinPlanReport, PlanReport, PrefaultPlanReport};
use crate::config::{PoolConfig, SharingConfig};
use crate::error::Result;
use crate::host::capacity;
use crate::layout::{Extent, MAX_POOL_BYTES, format_bytes};
use crate::plugin::{
    self, Backing, BackingPlan, ExtentReport, PinContext, Pinner, PinnerPlugin, Registrar,
    RegistrarPlugin,
};
use crate::prefault::{self, FaultIn, PrefaultPlan};

/// Everything a build will do, resolved from the config. Making a plan
/// creates, maps and reserves nothing, and a plan cannot change once made:
/// its parts are read through its methods, and the build reads nothing of
/// the config that the plan resolved (where the memory comes from, the
/// shared files' names, the page size a joiner takes).
#[derive(Debug)]
pub struct PoolPlan {
    pub(crate) config: PoolConfig,
    pub(crate) backing_reason: String,
    pub(crate) backing: Box<dyn Backing>,
    pub(crate) backing_plan: BackingPlan,
    pub(crate) prefault: PrefaultPlan,
    pub(crate) pinner: Option<std::sync::Arc<dyn Pinner>>,
    pub(crate) registrars: Vec<Box<dyn Registrar>>,
    pub(crate) huge_pages: Option<HugePagesReport>,
    pub(crate) numa: Option<super::numa::NumaPlan>,
    pub(crate) origin: Origin,
}

/// Where a pool's memory comes from: decided by the plan, for every
/// backing alike, and consumed by the build.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Origin {
    /// This process maps it alone: the backing's own memory, or the files it
    /// planned.
    Own,
    /// The ranks of one engine share it over a rendezvous.
    Shared(SharedOrigin),
    /// A keeper leases it.
    Leased(LeasedOrigin),
}

/// A shared pool, as the plan decided it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SharedOrigin {
    /// The ranks, this one, the rendezvous and its timeouts.
    pub sharing: SharingConfig,
    /// The data files' names, one per extent (empty paths for files only
    /// the socket passes).
    pub files: Vec<PathBuf>,
    /// Whether a joiner takes its creator's page size when it differs
    /// (`huge_pages = "prefer"`), instead of failing.
    pub take_creators_pages: bool,
}

/// A leased pool, as the plan decided it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LeasedOrigin {
    /// The kept pool's name.
    pub keeper: String,
    /// The ranks of the engine that share the lease, when it has several.
    pub ranks: Option<SharingConfig>,
    /// What this process builds when no keeper answers
    /// (`keeper_fallback = "build"`); `None`: the build fails instead.
    pub fallback: Option<Box<Origin>>,
}

impl Origin {
    /// The ranks this process is one of: a shared pool's, or those sharing
    /// a lease.
    pub fn ranks(&self) -> Option<&SharingConfig> {
        match self {
            Origin::Own => None,
            Origin::Shared(s) => Some(&s.sharing),
            Origin::Leased(l) => l.ranks.as_ref(),
        }
    }
}

/// A backing, configured and planned.
type Planned = (
    plugin::BackingSelection,
    Box<dyn Backing>,
    crate::plugin::BackingPlan,
);

/// A backing planned, with what `huge_pages` got.
type Chosen = (
    plugin::BackingSelection,
    Box<dyn Backing>,
    crate::plugin::BackingPlan,
    Option<HugePagesReport>,
);

fn plan_with(config: &PoolConfig) -> Result<Planned> {
    let selection = plugin::select_backing(config)?;
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
fn choose_backing(config: &PoolConfig, backing_config: PoolConfig) -> Result<Chosen> {
    use crate::config::HugePages;
    use crate::host::capacity::Verdict;
    let Some(policy) = backing_config.huge_pages else {
        let (s, b, p) = plan_with(&backing_config)?;
        return Ok((s, b, p, None));
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
        let (s, b, p) = plan_with(&backing_config)?;
        let r = report(&p, "huge_pages = off: base pages".into(), false);
        return Ok((s, b, p, r));
    }
    let first = plan_with(&backing_config);
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
            Ok((s, b, p, r))
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
                    Ok((s, b, p, r))
                }
                (why, _) => {
                    let why = why.unwrap_or_default();
                    let fallback = PoolConfig {
                        dir: None,
                        page_size: None,
                        huge_pages: Some(HugePages::Off),
                        ..backing_config
                    };
                    let (s, b, p) = plan_with(&fallback)?;
                    let r = report(
                        &p,
                        format!(
                            "huge pages cannot hold the pool ({why}): {} pages instead",
                            crate::layout::format_bytes(p.size.page().get())
                        ),
                        true,
                    );
                    Ok((s, b, p, r))
                }
            }
        }
    }
}

impl PoolPlan {
    /// The config the plan was made from.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Why this backing.
    pub fn backing_reason(&self) -> &str {
        &self.backing_reason
    }

    /// The configured backing.
    pub fn backing(&self) -> &dyn Backing {
        &*self.backing
    }

    /// What the backing will map.
    pub fn backing_plan(&self) -> &BackingPlan {
        &self.backing_plan
    }

    /// How the pool will be prefaulted (this rank's shard of a shared pool).
    pub fn prefault(&self) -> &PrefaultPlan {
        &self.prefault
    }

    /// The pinner, when one is asked for.
    pub fn pinner(&self) -> Option<&dyn Pinner> {
        self.pinner.as_deref()
    }

    /// The registrars, in order.
    pub fn registrars(&self) -> &[Box<dyn Registrar>] {
        &self.registrars
    }

    /// What `huge_pages` asked for and what the pool gets, when it asked.
    pub fn huge_pages(&self) -> Option<&HugePagesReport> {
        self.huge_pages.as_ref()
    }

    /// What `numa_node` asked for and the node this process binds, when it
    /// asked.
    pub fn numa(&self) -> Option<&super::numa::NumaPlan> {
        self.numa.as_ref()
    }

    /// Where the memory comes from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The ranks this process is one of (a shared pool's, or those sharing
    /// a lease).
    pub fn ranks(&self) -> Option<&SharingConfig> {
        self.origin.ranks()
    }
}

impl PoolPlan {
    /// Resolve a config: plugins, sizes, capacity checks and prefault.
    ///
    /// # Errors
    /// Configuration errors (unknown plugins or tables, bad sizes, settings a
    /// backing cannot honour). Capacity shortfalls are *not* errors here:
    /// they are verdicts in the plan, and [`Pool::build`](crate::Pool::build) refuses them.
    pub fn new(config: PoolConfig) -> Result<PoolPlan> {
        check_size(&config)?;
        check_dir(&config)?;
        config.validate_keeper()?;
        plugin::validate_plugin_tables(&config)?;
        if let Some(sharing) = &config.sharing {
            sharing.validate()?;
        }
        let numa = super::numa::resolve(&config)?;
        // The backing sees the one node that holds the whole pool (and checks
        // that node's own capacity: free huge pages per node); where ranks
        // bind their shards to nodes of their own it sees what was asked, a
        // list or "gpu", which names no one node; without a node, nothing.
        let numa_node = numa.as_ref().filter(|p| p.node.is_some()).map(|p| {
            p.whole_pool_on()
                .map_or_else(|| p.asked.clone(), crate::config::NumaNode::Node)
        });
        // An engine that leases its pool and never builds one plans only
        // what it does itself: the backing's side is the keeper's, so its
        // own `dir`, backing and page size are not planned (a page size is
        // checked against the kept pool's when it attaches).
        let leases_only = config.keeper.is_some()
            && config.keeper_fallback == crate::config::KeeperFallback::Fail;
        let backing_config = if leases_only {
            PoolConfig {
                backing: "auto".into(),
                dir: None,
                page_size: None,
                huge_pages: None,
                numa_node,
                ..config.clone()
            }
        } else {
            PoolConfig {
                numa_node,
                ..config.clone()
            }
        };
        let (mut selection, backing, mut backing_plan, huge_pages) =
            choose_backing(&config, backing_config)?;
        if let Some(keeper) = config.keeper.as_deref().filter(|_| leases_only) {
            selection.reason = format!(
                "leased from keeper `{keeper}` ({}): its backing; this process maps, pins and \
                 registers it",
                crate::shared::handoff("a kept pool")?.keeper_socket(keeper)
            );
        }
        // Memory that crosses processes needs the handoff: say so now, not
        // at map time.
        if config.sharing.is_some() {
            crate::shared::handoff("a shared pool")?;
        }
        // A shared pool of files names them in the plan (the file
        // rendezvous's data files).
        if let (Some(sharing), crate::plugin::MemorySource::Files(files)) =
            (&config.sharing, &backing_plan.source)
            && files.dir.is_some()
        {
            backing_plan.files = shared_names(files, sharing);
        }
        let origin = origin(&config, &backing_plan, leases_only)?;
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
        let pinner = if let Some(kind) = &config.pin.kind {
            let p = plugin::lookup::<PinnerPlugin>(kind)?;
            Some(std::sync::Arc::from((p.build)(
                config.plugin_table(p.name),
            )?))
        } else {
            if config.pin.background {
                return Err(crate::Error::config(
                    "background pinning needs a pinner: set pin.kind (--pin cuda or --pin mlock)",
                ));
            }
            None
        };
        if config.pin.background_chunk.is_some_and(|c| c.get() == 0) {
            return Err(crate::Error::config(
                "pin.background_chunk is 0; give a size such as \"256MiB\", or leave it out",
            ));
        }
        let registrars = config
            .register
            .iter()
            .map(|name| {
                let r = plugin::lookup::<RegistrarPlugin>(name)?;
                (r.build)(config.plugin_table(r.name))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PoolPlan {
            huge_pages,
            numa,
            backing_reason: selection.reason,
            backing,
            backing_plan,
            prefault,
            pinner,
            registrars,
            origin,
            config,
        })
    }

    /// This plan as a shared pool's joiner whose `huge_pages = "prefer"`
    /// chose other pages than the creator makes it again: with the
    /// creator's `page` size (its huge pages, or base pages without a dir).
    ///
    /// # Errors
    /// As for [`PoolPlan::new`].
    pub(crate) fn with_creators_pages(&self, page: u64) -> Result<PoolPlan> {
        use crate::config::HugePages;
        let base = crate::sys::base_page_size() as u64;
        let config = if page == base {
            PoolConfig {
                dir: None,
                page_size: None,
                huge_pages: Some(HugePages::Off),
                ..self.config.clone()
            }
        } else {
            PoolConfig {
                page_size: Some(crate::size::ByteSize(page)),
                huge_pages: Some(HugePages::Required),
                ..self.config.clone()
            }
        };
        let mut plan = PoolPlan::new(config)?;
        let got = crate::layout::format_bytes(page);
        plan.huge_pages = Some(HugePagesReport {
            asked: "prefer",
            reason: format!(
                "the shared pool's creator has {got} pages: every rank takes its choice"
            ),
            got,
            page_size: page,
            fell_back: page == base,
        });
        Ok(plan)
    }

    /// The plan as a serializable report (`hostpool plan --json`).
    pub fn report(&self) -> PlanReport {
        let bp = &self.backing_plan;
        let mut explain = vec![self.backing_reason.clone()];
        explain.extend(bp.explain.iter().cloned());
        explain.extend(self.prefault.explain.iter().cloned());
        explain.push(match &self.pinner {
            Some(p) => format!(
                "pin with {} ({})",
                p.name(),
                if self.config.pin.required {
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
        if let Some(h) = &self.huge_pages {
            explain.push(format!(
                "huge_pages = {}: {} pages ({})",
                h.asked, h.got, h.reason
            ));
        }
        if let Some(numa) = &self.numa {
            explain.push(super::numa::explain(
                numa,
                self.prefault.extent,
                self.config.sharing.is_some(),
            ));
        }
        for c in &bp.capacity {
            explain.push(format!(
                "capacity {}: need {}, free {} ({}): {:?}",
                c.resource,
                format_bytes(c.need),
                c.free.map_or("unknown".to_string(), format_bytes),
                c.source,
                c.verdict
            ));
        }
        let size = bp.size;
        let shards: Vec<ExtentReport> = match &self.config.sharing {
            Some(s) => crate::layout::shards(size.mapped(), size.page(), s.world)
                .map(|v| v.into_iter().map(ExtentReport::from).collect())
                .unwrap_or_default(),
            None => crate::layout::shards(
                size.page().round_down(self.prefault.extent.len),
                size.page(),
                u32::try_from(self.prefault.threads).unwrap_or(1),
            )
            .map(|v| v.into_iter().map(ExtentReport::from).collect())
            .unwrap_or_default(),
        };
        let pin_plan = self
            .pinner
            .as_ref()
            .map_or(Value::Null, |p| p.plan(size, &PinContext::of(&self.config)));
        let registration_plans = self
            .registrars
            .iter()
            .map(|r| serde_json::json!({"kind": r.name(), "plan": r.plan(size, &PinContext::of(&self.config))}))
            .collect();
        let prefault_cost = plugin::lookup::<plugin::BackingPlugin>(bp.backing)
            .ok()
            .and_then(|r| r.cost)
            .unwrap_or(plugin::PrefaultCost::DEFAULT);
        let predicted = crate::plugin::predict(
            size,
            &crate::plugin::CostInputs {
                prefault: prefault_cost,
                prefault_bytes: self.prefault.extent.len,
                threads: self.prefault.threads,
                pin: self
                    .pinner
                    .as_ref()
                    .and_then(|p| plugin::lookup::<PinnerPlugin>(p.name()).ok())
                    .and_then(|r| r.cost),
                registrars: self
                    .registrars
                    .iter()
                    .filter_map(|r| plugin::lookup::<RegistrarPlugin>(r.name()).ok())
                    .filter_map(|r| r.cost)
                    .collect(),
            },
        );
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
        PlanReport {
            version: crate::VERSION,
            huge_pages: self.huge_pages.clone(),
            numa: self.numa.clone(),
            shards,
            pin_plan,
            registration_plans,
            predicted_seconds: predicted,
            backing: bp.backing.to_string(),
            page_size: bp.size.page().get(),
            logical_bytes: bp.size.logical(),
            mapped_bytes: bp.size.mapped(),
            segments: super::report::segment_reports(bp),
            files: bp.files.iter().map(|p| p.display().to_string()).collect(),
            options: bp.options.clone(),
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
            capacity: bp.capacity.clone(),
            fits: bp
                .capacity
                .iter()
                .all(|c| c.verdict != capacity::Verdict::Short),
            explain,
        }
    }
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

/// Where the memory of `config`'s pool comes from. Whether a backing can
/// be shared is decided here, once, for every backing: memory of its own
/// ([`MemorySource::Own`](crate::plugin::MemorySource)) has no name another
/// process could open.
///
/// # Errors
/// [`crate::Error::Config`] for a shared pool of a backing that maps memory
/// of its own.
fn origin(config: &PoolConfig, backing_plan: &BackingPlan, leases_only: bool) -> Result<Origin> {
    let build = match (&config.sharing, &backing_plan.source) {
        (None, _) => Origin::Own,
        (Some(sharing), crate::plugin::MemorySource::Files(files)) => {
            Origin::Shared(SharedOrigin {
                sharing: sharing.clone(),
                files: shared_names(files, sharing),
                take_creators_pages: config.huge_pages == Some(crate::config::HugePages::Prefer),
            })
        }
        (Some(sharing), crate::plugin::MemorySource::Own) if !leases_only => {
            return Err(crate::Error::config(format!(
                "backing {} cannot be shared between processes (shared pool `{}`): its memory \
                 has no name another rank could open, and each rank would get a private pool \
                 of its own; drop --backing {} (auto then picks segmented files in /dev/shm), \
                 or give --dir /dev/shm or a hugetlbfs mount",
                backing_plan.backing, sharing.name, backing_plan.backing
            )));
        }
        (Some(_), crate::plugin::MemorySource::Own) => Origin::Own,
    };
    Ok(match &config.keeper {
        None => build,
        Some(keeper) => Origin::Leased(LeasedOrigin {
            keeper: keeper.clone(),
            ranks: config.sharing.clone(),
            fallback: (!leases_only).then(|| Box::new(build)),
        }),
    })
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

    /// Where memory comes from is decided by the plan, for every backing:
    /// memory of a backing's own is never shared (each rank would map a
    /// private pool without a word), a shared pool of files gets its
    /// names, and a lease carries what to build when no keeper answers.
    #[test]
    fn the_plan_decides_where_memory_comes_from_for_every_backing() {
        let size = round_to_page(8 << 20, PageSize::BASE_4K).unwrap();
        let own = BackingPlan::new("anyown", size);
        let mut files = BackingPlan::new("anyfiles", size);
        files.source = crate::plugin::MemorySource::Files(
            crate::plugin::FilePlan::new(
                vec![Extent {
                    offset: 0,
                    len: size.mapped(),
                }],
                |_| Err(crate::Error::config("not made in this test")),
                Vec::new,
                "",
            )
            .named_in(PathBuf::from("/dev/shm"), false),
        );
        let sharing = SharingConfig {
            name: "unit-origin".into(),
            world: 2,
            rank: 1,
            attach_timeout_secs: 1.0,
            barrier_timeout_secs: 1.0,
            rendezvous: crate::config::Rendezvous::File,
            control_dir: None,
        };
        let private = PoolConfig::default();
        assert_eq!(origin(&private, &own, false).unwrap(), Origin::Own);
        assert_eq!(origin(&private, &files, false).unwrap(), Origin::Own);
        let shared = PoolConfig {
            sharing: Some(sharing.clone()),
            huge_pages: Some(crate::config::HugePages::Prefer),
            ..PoolConfig::default()
        };
        let e = origin(&shared, &own, false).unwrap_err();
        assert!(
            e.is_usage() && e.to_string().contains("backing anyown cannot be shared"),
            "{e}"
        );
        let Origin::Shared(s) = origin(&shared, &files, false).unwrap() else {
            panic!("a shared pool of files is shared");
        };
        assert_eq!(s.sharing, sharing);
        assert_eq!(
            s.files,
            [PathBuf::from("/dev/shm/hostpool-unit-origin.pool")]
        );
        assert!(s.take_creators_pages);
        let leased = PoolConfig {
            keeper: Some("kv0".into()),
            ..shared.clone()
        };
        let Origin::Leased(l) = origin(&leased, &files, false).unwrap() else {
            panic!("a keeper's pool is leased");
        };
        assert_eq!(
            (l.keeper.as_str(), l.ranks.as_ref()),
            ("kv0", Some(&sharing))
        );
        assert!(matches!(l.fallback.as_deref(), Some(Origin::Shared(_))));
        // Leasing only: nothing to build, and nothing refused of the
        // placeholder backing.
        let Origin::Leased(l) = origin(&leased, &own, true).unwrap() else {
            panic!("a keeper's pool is leased");
        };
        assert_eq!(l.fallback, None);
    }

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
