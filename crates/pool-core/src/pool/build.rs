//! Building a pool: [`Pool::build_with`] is the README's arrow, one function
//! per step: [`map`] → [`bind`] → [`prefault()`] → [`rendezvous`] →
//! [`attach`] (and the placement check) → [`pin`] → [`register`]. Every step
//! after `map` works on the [`Pool`] that owns what is built so far, so an
//! early return tears it down (its `Drop`).

use std::time::Instant;

use serde_json::Value;

use super::plan::{Origin, SharedOrigin};
use super::report::{Phases, PinReport, PoolReport, RegistrationReport, segment_reports};
use super::{NUMA_SAMPLES, Observer, Phase, Pool, PoolPlan, gone, timed};
use crate::background::{Background, MappingOwner, PinStatus};
use crate::config::PinScope;
use crate::error::{Context, Result};
use crate::file::Attachment;
use crate::host::capacity;
use crate::interrupt::Cancel;
use crate::layout::Extent;
use crate::plugin::Mapping;
use crate::plugin::{FilePlan, MemorySource, PinContext, RankBarrier};
use crate::prefault::{self, PrefaultMethod, PrefaultOutcome};
use crate::sys::Region;

/// How a build runs besides its plan and observer: the embedding engine's
/// barrier for a shared pool, the token that stops it, and what a failed
/// creator of a shared pool does about the ranks not told yet. Each build
/// has its own: nothing of a build is process-wide.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct BuildOptions<'a> {
    /// The engine's own barrier for a shared pool (`None`: the
    /// rendezvous' own).
    pub barrier: Option<&'a dyn RankBarrier>,
    /// The token that stops the build.
    pub cancel: Cancel,
    /// What a failed creator does about the ranks not told yet.
    pub refusals: crate::shared::Refusals,
}

impl std::fmt::Debug for BuildOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildOptions")
            .field("barrier", &self.barrier.is_some())
            .field("cancel", &self.cancel)
            .field("refusals", &self.refusals)
            .finish()
    }
}

impl<'a> BuildOptions<'a> {
    /// No barrier of the engine's, a token nothing has cancelled, refusals
    /// served from a thread.
    pub fn new() -> BuildOptions<'a> {
        BuildOptions::default()
    }

    /// With the engine's own barrier.
    #[must_use]
    pub fn barrier(mut self, barrier: Option<&'a dyn RankBarrier>) -> BuildOptions<'a> {
        self.barrier = barrier;
        self
    }

    /// Stopped by `cancel`.
    #[must_use]
    pub fn cancel(mut self, cancel: &Cancel) -> BuildOptions<'a> {
        self.cancel = cancel.clone();
        self
    }

    /// With this refusal policy.
    #[must_use]
    pub fn refusals(mut self, refusals: crate::shared::Refusals) -> BuildOptions<'a> {
        self.refusals = refusals;
        self
    }
}

impl Pool {
    /// Build the pool a plan describes: refuse a capacity shortfall, map,
    /// prefault, pin, register.
    ///
    /// # Errors
    /// The first failing step's error, after everything built so far has been
    /// torn down. A best-effort pin that fails is not an error: the report
    /// says `skipped` with the reason.
    pub fn build(plan: &PoolPlan, observer: &dyn Observer) -> Result<Pool> {
        Pool::build_with(plan, observer, None)
    }

    /// As [`Pool::build`], with the embedding engine's own barrier for a
    /// shared pool (the built-in one uses the pool's control file).
    ///
    /// # Errors
    /// As for [`Pool::build`], and [`crate::Error::Peer`] when a peer rank
    /// failed, died or never attached.
    pub fn build_with(
        plan: &PoolPlan,
        observer: &dyn Observer,
        barrier: Option<&dyn RankBarrier>,
    ) -> Result<Pool> {
        Pool::build_with_options(plan, observer, &BuildOptions::new().barrier(barrier))
    }

    /// As [`Pool::build_with`], with the build's options: the engine's
    /// barrier, the token that stops it (once cancelled, by the caller's
    /// signal handler or from another thread, the build stops at its next
    /// step, whichever phase it is in: prefault, a shared pool's waits and
    /// barrier, a lease's waits; tears down what it built and returns
    /// [`crate::Error::Interrupted`]; other builds in the process, with
    /// tokens of their own, go on), and what a failed creator of a shared
    /// pool does about the ranks not told yet.
    ///
    /// # Errors
    /// As for [`Pool::build_with`], and [`crate::Error::Interrupted`].
    pub fn build_with_options(
        plan: &PoolPlan,
        observer: &dyn Observer,
        options: &BuildOptions<'_>,
    ) -> Result<Pool> {
        let barrier = options.barrier;
        let cancel = &options.cancel;
        let mut pool = match map(plan, observer, options) {
            // A joiner whose `huge_pages = "prefer"` chose other pages than
            // the shared pool's creator: every rank takes the creator's.
            Err(crate::Error::PageSizeMismatch { creator_page, .. })
                if takes_creators_pages(&plan.origin) =>
            {
                let creators = plan.with_creators_pages(creator_page)?;
                return Pool::build_with_options(&creators, observer, options);
            }
            other => other?,
        };
        // Said once the pool has its pages (a shared pool's rank may yet take
        // its creator's choice).
        if let Some(h) = plan.huge_pages.as_ref().filter(|h| h.fell_back) {
            tracing::warn!("huge_pages = {}: {}", h.asked, h.reason);
        }
        // From here on, an early return drops `pool`, which tears down.
        let leased = pool.report.keeper.is_some();
        if !leased {
            bind(&mut pool, plan, barrier)?;
        }
        let faulted = if leased {
            Ok(resident())
        } else {
            prefault(&mut pool, plan, observer, cancel)
        };
        // Every rank of a shared pool meets its peers, even after a failure,
        // so that they fail on its error instead of waiting for it.
        let met = rendezvous(&mut pool, plan, &faulted, barrier);
        pool.report.prefault = Some(faulted?);
        if plan.backing_plan.transparent_huge_pages && !leased {
            pool.report.thp = thp_backed(&pool);
        }
        met?;
        attach(&mut pool, plan, observer)?;
        check_placement(&mut pool, plan)?;
        cancel.check()?;
        pin(&mut pool, plan, observer)?;
        cancel.check()?;
        register(&mut pool, plan, observer)?;
        Ok(pool)
    }

    /// Build a keeper's pool: capacity checks, map (files only, which a
    /// lease can be handed), NUMA binding, prefault and placement; no pin,
    /// no registration (those belong to the process that uses the memory).
    /// With the pool, a second descriptor of each of its files and the
    /// file's extent.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for a backing that maps memory of its own;
    /// the steps' errors, after what was built is torn down.
    pub fn build_kept(
        plan: &PoolPlan,
        observer: &dyn Observer,
        cancel: &Cancel,
    ) -> Result<(Pool, Vec<(std::os::fd::OwnedFd, Extent)>)> {
        let bp = &plan.backing_plan;
        let MemorySource::Files(files) = &bp.source else {
            return Err(crate::Error::config(format!(
                "backing {} maps memory of its own, which a keeper cannot hand to another \
                 process; use a file backing (shm-segmented, hugetlbfs)",
                bp.backing
            )));
        };
        capacity::require(&bp.capacity)?;
        let (mapping, map_secs) = timed(observer, Phase::Map, bp.size.mapped(), || {
            crate::file::map_planned(files, bp.size)
        });
        let mapping = mapping?;
        let fds = mapping
            .pool_files()
            .iter()
            .map(|f| Ok((f.fd.try_clone()?, f.extent)))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| {
                crate::Error::os(
                    "fcntl(F_DUPFD_CLOEXEC)",
                    e,
                    Context::new(bp.size.mapped(), bp.size.page())
                        .remedy("raise the open-file limit (ulimit -n)"),
                )
            })?;
        let mut report = first_report(plan, &mapping, map_secs);
        report.sharing = None;
        let mut pool = Pool::of(Box::new(mapping), report);
        bind(&mut pool, plan, None)?;
        let faulted = prefault(&mut pool, plan, observer, cancel);
        pool.report.prefault = Some(faulted?);
        check_placement(&mut pool, plan)?;
        Ok((pool, fds))
    }
}

/// Whether a joiner of the shared pool `origin` builds (itself, or when no
/// keeper answers) takes its creator's page size when it differs.
fn takes_creators_pages(origin: &Origin) -> bool {
    match origin {
        Origin::Shared(s) => s.take_creators_pages,
        Origin::Leased(l) => l.fallback.as_deref().is_some_and(takes_creators_pages),
        Origin::Own => false,
    }
}

/// How much of the pool transparent huge pages back, from smaps.
fn thp_backed(pool: &Pool) -> Option<super::report::ThpReport> {
    let region = pool.region()?;
    let backed = crate::host::process::smaps_bytes(
        region.addr() as usize,
        region.mapped_len(),
        "AnonHugePages",
    )?;
    Some(super::report::ThpReport {
        backed_bytes: backed,
        mapped_bytes: region.mapped_len(),
        mode: crate::host::thp::mode(),
    })
}

/// The prefault outcome of memory leased from a keeper: it came resident.
fn resident() -> PrefaultOutcome {
    PrefaultOutcome {
        method: "resident",
        threads: 0,
        bytes: 0,
        seconds: 0.0,
        fell_back_to_touch: false,
        per_thread: Vec::new(),
    }
}

/// The mapping of the backing's plan, in a [`Pool`] with its first report,
/// from where the plan says the memory comes: a keeper's lease (or, when no
/// keeper answers and the plan says so, what this process builds instead),
/// the backing's own memory, or the files it planned, which the core
/// creates, maps and (for a shared pool) shares.
fn map(plan: &PoolPlan, observer: &dyn Observer, options: &BuildOptions<'_>) -> Result<Pool> {
    let bp = &plan.backing_plan;
    let cancel = &options.cancel;
    let (origin, fallback) = match &plan.origin {
        Origin::Leased(lease) => {
            let (leased, map_secs) = timed(observer, Phase::Map, bp.size.mapped(), || {
                crate::shared::handoff("a kept pool").and_then(|h| h.lease(&plan.config, cancel))
            });
            match (leased, lease.fallback.as_deref()) {
                (Ok(mapping), _) => {
                    let report = first_report(plan, mapping.as_ref(), map_secs);
                    return Ok(Pool::of(mapping, report));
                }
                (
                    Err(crate::Error::Keeper {
                        absent: true,
                        message,
                        ..
                    }),
                    Some(build),
                ) => {
                    tracing::warn!(
                        "{message}; building a pool of this process's own (keeper_fallback = \"build\")"
                    );
                    (build, Some(message))
                }
                (Err(e), _) => return Err(e),
            }
        }
        own_or_shared => (own_or_shared, None),
    };
    // A shared pool's creator checks capacity itself: once it has reserved
    // the pages, the counts look too low to joiners.
    if !matches!(origin, Origin::Shared(_)) {
        capacity::require(&bp.capacity)?;
    }
    let (mapping, map_secs) = timed(observer, Phase::Map, bp.size.mapped(), || {
        match (&bp.source, origin) {
            (MemorySource::Files(files), Origin::Shared(shared)) => {
                share(plan, files, shared, options)
            }
            (MemorySource::Files(files), _) => {
                Ok(Box::new(crate::file::map_planned(files, bp.size)?) as Box<dyn Attachment>)
            }
            // The plan refuses to share memory of a backing's own.
            (MemorySource::Own, _) => plan
                .backing
                .map(bp)
                .map(|m| Box::new(OwnMapping(m)) as Box<dyn Attachment>),
        }
    });
    let mapping = mapping?;
    let mut report = first_report(plan, mapping.as_ref(), map_secs);
    report.keeper_fallback = fallback;
    Ok(Pool::of(mapping, report))
}

impl Pool {
    /// A pool of `mapping`, with its first report, nothing pinned yet.
    fn of(mapping: Box<dyn Attachment>, report: PoolReport) -> Pool {
        Pool {
            mapping: Some(crate::sys::Owner::new(mapping)),
            pin: None,
            background: None,
            pin_extent: None,
            registrations: Vec::new(),
            report,
            owner: std::process::id(),
        }
    }
}

/// A shared pool's mapping, over the rendezvous its plan names, of the
/// files its plan named.
fn share(
    plan: &PoolPlan,
    files: &FilePlan,
    shared: &SharedOrigin,
    options: &BuildOptions<'_>,
) -> Result<Box<dyn Attachment>> {
    let bp = &plan.backing_plan;
    crate::shared::map_shared(crate::shared::SharedPoolSpec {
        sharing: &shared.sharing,
        size: bp.size,
        files: shared
            .files
            .iter()
            .cloned()
            .zip(files.extents.iter().copied())
            .collect(),
        capacity: &bp.capacity,
        recheck: &*files.recheck,
        create: &*files.create,
        map: crate::file::MapContext {
            enomem_remedy: files.enomem_remedy.clone(),
            truncated_remedy:
                "a rank, or a process that opened a rank's descriptor, truncated the \
                               shared pool's file; stop every rank and start them again"
                    .into(),
        },
        cancel: options.cancel.clone(),
        refusals: options.refusals,
    })
}

fn first_report(plan: &PoolPlan, mapping: &dyn Attachment, map_secs: f64) -> PoolReport {
    let bp = &plan.backing_plan;
    let region = mapping.region();
    let leased = mapping.leased();
    PoolReport {
        version: crate::VERSION,
        backing: leased
            .as_ref()
            .and_then(|l| l["backing"].as_str())
            .unwrap_or(bp.backing)
            .to_string(),
        page_size: region.page().get(),
        logical_bytes: region.logical_len(),
        mapped_bytes: region.mapped_len(),
        address: format!("{:#x}", region.addr() as usize),
        segments: if leased.is_some() {
            Vec::new()
        } else {
            segment_reports(bp)
        },
        options: if leased.is_some() {
            Value::Null
        } else {
            bp.options.clone()
        },
        prefault: None,
        phases: Phases {
            map: Some(map_secs),
            ..Phases::default()
        },
        pin: PinReport {
            kind: plan.config.pin.kind_name().to_string(),
            status: PinStatus::Off,
            reason: None,
            details: Value::Null,
        },
        registrations: Vec::new(),
        capacity: if mapping.checked_capacity() {
            bp.capacity.clone()
        } else {
            Vec::new()
        },
        sharing: mapping.sharing(),
        numa: None,
        keeper: leased,
        keeper_fallback: None,
        huge_pages: plan.huge_pages.clone(),
        thp: None,
        teardown_issues: Vec::new(),
    }
}

/// The pool's mapping, for a step that reads it (its owner is a field
/// borrowed alone, so the step may write the report meanwhile).
fn held(owner: &Option<MappingOwner>) -> Result<&dyn Attachment> {
    owner.as_ref().map(|o| &**o.get()).ok_or_else(gone)
}

/// The pool's mapping to change (its rendezvous), before any background
/// pin runs on it.
fn held_mut(owner: &mut Option<MappingOwner>) -> Result<&mut (dyn Attachment + 'static)> {
    owner
        .as_mut()
        .and_then(MappingOwner::get_mut)
        .map(|m| &mut **m)
        .ok_or_else(gone)
}

/// Bind the pool's pages (this rank's shard, in a shared pool: each rank's
/// shard goes to its own node) to the plan's NUMA node before the first
/// touch decides where they go. A shared pool's peers learn the cause
/// rather than a vanished rank.
fn bind(pool: &mut Pool, plan: &PoolPlan, barrier: Option<&dyn RankBarrier>) -> Result<()> {
    let Some(numa) = &plan.numa else {
        return Ok(());
    };
    pool.report.numa = Some(super::numa::NumaReport::unsampled(numa, false));
    let Some(node) = numa.node else {
        return Ok(());
    };
    let mapping = held_mut(&mut pool.mapping)?;
    let region = mapping.region();
    let own = own_range(&region, plan);
    let bound = match region.sub(own).filter(|_| own.len > 0) {
        Some(range) => crate::host::numa::bind(&range, node),
        // An empty shard (more ranks than pages) has nothing to bind.
        None => Ok(()),
    };
    if let Err(e) = bound {
        if plan.ranks().is_some() {
            let _ = mapping.rendezvous(Err(e.to_string()), barrier);
        }
        return Err(e);
    }
    if let Some(r) = &mut pool.report.numa {
        r.bound = true;
    }
    Ok(())
}

/// The range this process binds and faults: its shard of a shared pool,
/// else the whole pool.
fn own_range(region: &Region<'_>, plan: &PoolPlan) -> Extent {
    if plan.ranks().is_some() {
        plan.prefault.extent
    } else {
        Extent {
            offset: 0,
            len: region.mapped_len(),
        }
    }
}

/// Fault this rank's pages in (its shard of a shared pool).
fn prefault(
    pool: &mut Pool,
    plan: &PoolPlan,
    observer: &dyn Observer,
    cancel: &Cancel,
) -> Result<PrefaultOutcome> {
    let mapping = held(&pool.mapping)?;
    let (outcome, secs) = timed(observer, Phase::Prefault, plan.prefault.extent.len, || {
        // Touching a page the backing cannot supply is SIGBUS: have the
        // backing allocate the range first, which fails cleanly instead.
        if matches!(plan.prefault.method, PrefaultMethod::Touch(_)) {
            mapping.reserve_for_touch(plan.prefault.extent)?;
        }
        prefault::run(
            &mapping.region(),
            &plan.prefault,
            &|done| observer.progress(Phase::Prefault, done),
            cancel,
        )
    });
    pool.report.phases.prefault = Some(secs);
    outcome
}

/// A shared pool's ranks meet at the barrier with their prefault's outcome.
fn rendezvous(
    pool: &mut Pool,
    plan: &PoolPlan,
    faulted: &Result<PrefaultOutcome>,
    barrier: Option<&dyn RankBarrier>,
) -> Result<()> {
    if plan.ranks().is_none() {
        return Ok(());
    }
    let mapping = held_mut(&mut pool.mapping)?;
    let t = Instant::now();
    let met = mapping.rendezvous(
        faulted.as_ref().map(|_| ()).map_err(|e| e.to_string()),
        barrier,
    );
    pool.report.phases.barrier = Some(t.elapsed().as_secs_f64());
    met
}

/// A shared pool pinned whole: fill the page tables of the peers' shards
/// now, in one pass, rather than let the driver fault them in one page at a
/// time under its lock.
fn attach(pool: &mut Pool, plan: &PoolPlan, observer: &dyn Observer) -> Result<()> {
    let leased = pool.report.keeper.is_some();
    if (plan.ranks().is_none() && !leased)
        || plan.pinner.is_none()
        || plan.config.pin.scope != PinScope::Pool
    {
        return Ok(());
    }
    let region = held(&pool.mapping)?.region();
    // Leased memory is resident, but in none of this process's page tables.
    let own = if leased {
        Extent { offset: 0, len: 0 }
    } else {
        plan.prefault.extent
    };
    let (attached, secs) = timed(
        observer,
        Phase::Attach,
        region.mapped_len() - own.len,
        || attach_peers(&region, own),
    );
    pool.report.phases.attach = Some(secs);
    attached
}

/// Where the pages went, when a node was asked for: this process's range
/// (its shard, in a shared pool) and, in a shared pool, every shard. Exact
/// placement is required only where this process bound and faulted every
/// page of its range: not for leased memory (the keeper placed it), and not
/// without prefault (pages are not in memory yet).
fn check_placement(pool: &mut Pool, plan: &PoolPlan) -> Result<()> {
    let Some(numa) = &plan.numa else {
        return Ok(());
    };
    let leased = pool.report.keeper.is_some();
    let mut report = pool
        .report
        .numa
        .take()
        .unwrap_or_else(|| super::numa::NumaReport::unsampled(numa, false));
    let Some(node) = numa.node else {
        pool.report.numa = Some(report);
        return Ok(());
    };
    let region = held(&pool.mapping)?.region();
    let own = if leased {
        Extent {
            offset: 0,
            len: region.mapped_len(),
        }
    } else {
        own_range(&region, plan)
    };
    let placement = super::numa::sample_own(&region, own, node, NUMA_SAMPLES)?;
    report.sampled = placement.sampled;
    report.on_node = placement.on_node;
    report.elsewhere = placement.elsewhere.clone();
    if let Some(s) = plan.ranks().filter(|_| !leased) {
        let shards = crate::layout::shards(region.mapped_len(), region.page(), s.world)?;
        let per_shard = (NUMA_SAMPLES / shards.len().max(1)).max(8);
        report.shards = super::numa::sample_shards(&region, &shards, numa, s.rank, per_shard)?;
    }
    let bound = report.bound;
    pool.report.numa = Some(report);
    let faulted_all = bound
        && !leased
        && own.len > 0
        && !matches!(plan.prefault.method, PrefaultMethod::NoPrefault(_));
    if faulted_all {
        placement.require_exact()?;
    }
    Ok(())
}

/// Pin the whole pool, or with scope = shard only this rank's shard (an
/// empty shard, more ranks than pages, pins nothing), in the foreground or
/// on the background thread.
fn pin(pool: &mut Pool, plan: &PoolPlan, observer: &dyn Observer) -> Result<()> {
    let Some(pinner) = &plan.pinner else {
        return Ok(());
    };
    let mapped = pool.report.mapped_bytes;
    let pin_extent = match (plan.ranks(), plan.config.pin.scope) {
        // A leased pool's shard is of the keeper's size, not the plan's.
        (Some(s), PinScope::Shard) if pool.report.keeper.is_some() => {
            let region = held(&pool.mapping)?.region();
            crate::shared::shard(region.size(), s)?
        }
        (Some(_), PinScope::Shard) => plan.prefault.extent,
        _ => Extent {
            offset: 0,
            len: mapped,
        },
    };
    pool.pin_extent = Some(pin_extent);
    if pin_extent.len == 0 {
        pool.report.pin.status = PinStatus::Skipped;
        pool.report.pin.reason =
            Some("this rank's shard is empty (more ranks than pages): nothing to pin".into());
        return Ok(());
    }
    if plan.config.pin.background {
        // The thread runs on the mapping's owner, which joins it before the
        // mapping goes; the pool stops it first in `release`.
        let owner = pool.mapping.as_mut().ok_or_else(gone)?;
        let started = Background::start(
            owner,
            pin_extent,
            std::sync::Arc::clone(pinner),
            &plan.config,
        )?;
        pool.report.pin.status = PinStatus::Pinning;
        pool.report.pin.details = serde_json::json!({
            "background": true,
            "chunk": started.chunk(),
            "bytes": pin_extent.len,
        });
        pool.background = Some(started);
        return Ok(());
    }
    let region = held(&pool.mapping)?.region();
    let pin_region = region.sub(pin_extent).ok_or_else(gone)?;
    let (pinned, secs) = timed(observer, Phase::Pin, pin_region.mapped_len(), || {
        pinner.pin(pin_region, &PinContext::of(&plan.config))
    });
    pool.report.phases.pin = Some(secs);
    match pinned {
        Ok(pin) => {
            pool.report.pin.status = PinStatus::Pinned;
            pool.report.pin.details = pin.details();
            pool.pin = Some(pin);
        }
        Err(e) if !plan.config.pin.required => {
            tracing::warn!(
                "pinning with {} skipped, the pool stays pageable: {e}",
                pinner.name()
            );
            pool.report.pin.status = PinStatus::Skipped;
            pool.report.pin.reason = Some(e.to_string());
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Register the pool with each registrar, in order.
fn register(pool: &mut Pool, plan: &PoolPlan, observer: &dyn Observer) -> Result<()> {
    if plan.registrars.is_empty() {
        return Ok(());
    }
    let region = held(&pool.mapping)?.region();
    let (registered, secs) = timed(observer, Phase::Register, region.mapped_len(), || {
        for r in &plan.registrars {
            let reg = r.register(region, &PinContext::of(&plan.config))?;
            pool.report.registrations.push(RegistrationReport {
                kind: r.name().to_string(),
                details: reg.details(),
            });
            pool.registrations.push(reg);
        }
        Ok::<(), crate::Error>(())
    });
    pool.report.phases.register = Some(secs);
    registered
}

/// Map every page outside `own` (pages the peers faulted) into this
/// process's page tables with `MADV_POPULATE_READ`.
fn attach_peers(region: &Region<'_>, own: Extent) -> Result<()> {
    let before = Extent {
        offset: 0,
        len: own.offset,
    };
    let after = Extent {
        offset: own.end(),
        len: region.mapped_len() - own.end(),
    };
    for e in [before, after].into_iter().filter(|e| e.len > 0) {
        region.populate_read(e).map_err(|source| {
            let mut context = Context::new(e.len, region.page()).remedy(format!(
                "attaching to the peers' pages at offset {} failed",
                e.offset
            ));
            if let Some(addr) = region.at(e.offset) {
                context = context.addr(addr as usize);
            }
            crate::Error::os("madvise(MADV_POPULATE_READ)", source, context)
        })?;
    }
    Ok(())
}

/// A backing's own mapping, as the build holds it: a region and a
/// teardown, and nothing else to do.
#[derive(Debug)]
struct OwnMapping(Box<dyn Mapping>);

impl Attachment for OwnMapping {
    fn region(&self) -> Region<'_> {
        self.0.region()
    }

    fn files(&self) -> Vec<std::path::PathBuf> {
        self.0.files()
    }

    fn reserve_for_touch(&self, extent: Extent) -> Result<()> {
        self.0.reserve_for_touch(extent)
    }

    fn teardown(self: Box<Self>) -> Vec<crate::TeardownIssue> {
        self.0.teardown()
    }

    fn teardown_keeping_range(
        self: Box<Self>,
    ) -> (Vec<crate::TeardownIssue>, Option<crate::Placeholder>) {
        self.0.teardown_keeping_range()
    }
}
