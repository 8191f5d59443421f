//! Building a pool: [`Pool::build_with`] is the README's arrow, one function
//! per step: [`map`] → [`bind`] → [`prefault()`] → [`rendezvous`] →
//! [`attach`] (and the placement check) → [`pin`] → [`register`]. Every step
//! after `map` works on the [`Pool`] that owns what is built so far, so an
//! early return tears it down (its `Drop`).

use std::time::Instant;

use super::plan::{LeasePlan, Memory, Share, Source};
use super::report::{PoolReport, RegistrationReport};
use super::{NUMA_SAMPLES, Observer, Phase, Pool, PoolPlan, gone, timed};
use crate::background::{Background, MappingOwner, PinStatus};
use crate::config::PinScope;
use crate::error::{Context, Result};
use crate::host::capacity;
use crate::interrupt::Cancel;
use crate::layout::Extent;
use crate::plugin::Mapping;
use crate::plugin::{FilePlan, MemorySource, RankBarrier};
use crate::prefault::{self, PrefaultMethod, PrefaultOutcome};
use crate::shared::{Attached, Attachment};
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
    /// What hands memory between processes, for a shared or leased pool
    /// (`hostpool_handoff::HANDOFF`); a private pool needs none.
    pub handoff: Option<&'a dyn super::handoff::Handoff>,
}

impl std::fmt::Debug for BuildOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildOptions")
            .field("barrier", &self.barrier.is_some())
            .field("cancel", &self.cancel)
            .field("refusals", &self.refusals)
            .field("handoff", &self.handoff)
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

    /// Handing memory between processes with `handoff`.
    #[must_use]
    pub fn handoff(mut self, handoff: &'a dyn super::handoff::Handoff) -> BuildOptions<'a> {
        self.handoff = Some(handoff);
        self
    }

    /// The handoff, for `what` (a shared pool, a lease).
    fn handed(&self, what: &str) -> Result<&'a dyn super::handoff::Handoff> {
        self.handoff.ok_or_else(|| super::handoff::no_handoff(what))
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
        let mapped = match map(plan, observer, options) {
            // A joiner whose `huge_pages = "prefer"` chose other pages than
            // the shared pool's creator: every rank takes the creator's, as
            // the plan made ready.
            Err(e @ crate::Error::PageSizeMismatch { creator_page, .. }) => {
                return match plan.creators_pages(creator_page) {
                    Some(theirs) => Pool::build_with_options(theirs, observer, options),
                    None => Err(e),
                };
            }
            other => other?,
        };
        let mut pool = match mapped {
            Mapped::Pool(pool) => *pool,
            // No keeper answered: build the plan made for that.
            Mapped::Fallback(build, why) => {
                tracing::warn!(
                    "{why}; building a pool of this process's own (lease.fallback = \"build\")"
                );
                let mut pool = Pool::build_with_options(build, observer, options)?;
                pool.report.keeper_fallback = Some(why);
                return Ok(pool);
            }
        };
        // Said once the pool has its pages (a shared pool's rank may yet take
        // its creator's choice).
        if let Some(h) = plan.huge_pages().filter(|h| h.fell_back) {
            tracing::warn!("huge_pages = {}: {}", h.asked, h.reason);
        }
        // From here on, an early return drops `pool`, which tears down.
        let leased = matches!(plan.source, Source::Leased(_));
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
        if plan
            .backing_plan()
            .is_some_and(|bp| bp.transparent_huge_pages)
        {
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
        let (bp, files) = kept_files(plan)?;
        capacity::require(&bp.capacity)?;
        let (mapping, map_secs) = timed(observer, Phase::Map, bp.size.mapped(), || {
            crate::file::map_planned(files, bp.size)
        });
        let (pool, fds) = kept_pool(plan, mapping?, map_secs)?;
        Ok((settle_kept(pool, plan, observer, cancel)?, fds))
    }

    /// A keeper's pool again from its files, as a keeper that ran before
    /// kept them (handed back by systemd's file descriptor store, by the
    /// engines that map them, or found in a persist directory): each file
    /// checked against the plan (one per extent, in pool order, exactly the
    /// extent's length, of the plan's page size) before anything is mapped,
    /// then mapped. Nothing is created, prefaulted or cleared: the pages and
    /// their bytes are the ones the keeper before served. With the pool, a
    /// second descriptor of each file and its extent, as
    /// [`Pool::build_kept`] gives.
    ///
    /// # Errors
    /// [`crate::Error::Conflict`] naming the first file that is not the
    /// plan's (count, length or page size) and what it is instead; the map's
    /// errors.
    pub fn adopt_kept(
        plan: &PoolPlan,
        files: Vec<std::os::fd::OwnedFd>,
        observer: &dyn Observer,
    ) -> Result<(Pool, Vec<(std::os::fd::OwnedFd, Extent)>)> {
        let (bp, fp) = kept_files(plan)?;
        let page = bp.size.page();
        let refuse = |message: String| crate::Error::Conflict {
            path: std::path::PathBuf::from("(adopted files)"),
            message: format!(
                "the files handed to this keeper are not the pool its config plans: {message}; \
                 they were left as they are and nothing was mapped (start the keeper with the \
                 config it ran with, or remove what kept them to build the pool afresh)"
            ),
        };
        if files.len() != fp.extents.len() {
            return Err(refuse(format!(
                "{} file(s) for {} extent(s) of {}",
                files.len(),
                fp.extents.len(),
                crate::format_bytes(bp.size.mapped())
            )));
        }
        let mut pool_files = Vec::with_capacity(files.len());
        for (i, (fd, extent)) in files
            .into_iter()
            .zip(fp.extents.iter().copied())
            .enumerate()
        {
            let (id, len) = crate::file::id_and_len(&fd).map_err(|e| {
                crate::Error::os(
                    "fstat",
                    e,
                    Context::new(extent.len, page).remedy("an adopted pool file could not be read"),
                )
            })?;
            if len != extent.len {
                return Err(refuse(format!(
                    "file {i} is {} long, its extent {}",
                    crate::format_bytes(len),
                    crate::format_bytes(extent.len)
                )));
            }
            let theirs = rustix::fs::fstatfs(&fd)
                .map(|st| st.f_bsize as u64)
                .map_err(|e| {
                    crate::Error::os(
                        "fstatfs",
                        e,
                        Context::new(extent.len, page)
                            .remedy("an adopted pool file could not be read"),
                    )
                })?;
            if theirs != page.get() {
                return Err(refuse(format!(
                    "file {i} is of {} pages, the plan's of {}",
                    crate::format_bytes(theirs),
                    crate::format_bytes(page.get())
                )));
            }
            pool_files.push(crate::file::PoolFile {
                fd,
                path: None,
                id,
                extent,
            });
        }
        let ctx = crate::file::MapContext {
            enomem_remedy: fp.enomem_remedy.clone(),
            truncated_remedy: String::new(),
        };
        let (mapping, map_secs) = timed(observer, Phase::Map, bp.size.mapped(), || {
            crate::file::map_files(pool_files, bp.size, &ctx)
        });
        kept_pool(plan, mapping?, map_secs)
    }

    /// A keeper's pool built on `files` it made itself (empty, one per
    /// extent, each its extent's length: a persist directory's), as
    /// [`Pool::build_kept`] builds on files it creates: capacity checks,
    /// map, NUMA binding, prefault and placement.
    ///
    /// # Errors
    /// As [`Pool::adopt_kept`] and [`Pool::build_kept`].
    pub fn build_kept_on(
        plan: &PoolPlan,
        files: Vec<std::os::fd::OwnedFd>,
        observer: &dyn Observer,
        cancel: &Cancel,
    ) -> Result<(Pool, Vec<(std::os::fd::OwnedFd, Extent)>)> {
        capacity::require(&kept_files(plan)?.0.capacity)?;
        let (pool, fds) = Pool::adopt_kept(plan, files, observer)?;
        Ok((settle_kept(pool, plan, observer, cancel)?, fds))
    }
}

/// A keeper's plan: the backing's plan and the files it maps.
fn kept_files(plan: &PoolPlan) -> Result<(&crate::plugin::BackingPlan, &FilePlan)> {
    match &plan.source {
        Source::Kept(memory) => match &memory.plan.source {
            MemorySource::Files(files) => Ok((&memory.plan, files)),
            _ => Err(not_kept()),
        },
        _ => Err(not_kept()),
    }
}

fn not_kept() -> crate::Error {
    crate::Error::config(
        "a keeper builds the plan of a kept pool (PoolPlan::kept): files another process can be \
         handed",
    )
}

/// A keeper's pool of `mapping` (its files mapped), with a second
/// descriptor of each file and its extent: what a lease is handed.
fn kept_pool(
    plan: &PoolPlan,
    mapping: crate::file::FileMapping,
    map_secs: f64,
) -> Result<(Pool, Vec<(std::os::fd::OwnedFd, Extent)>)> {
    let size = mapping.region().mapped_len();
    let fds = mapping
        .pool_files()
        .iter()
        .map(|f| Ok((f.fd.try_clone()?, f.extent)))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| {
            crate::Error::os(
                "fcntl(F_DUPFD_CLOEXEC)",
                e,
                Context::new(size, mapping.region().page())
                    .remedy("raise the open-file limit (ulimit -n)"),
            )
        })?;
    let report = first_report(plan, mapping.region(), &Attached::Own, map_secs);
    Ok((Pool::of(Box::new(mapping), Attached::Own, report), fds))
}

/// A keeper's pool made resident where the plan puts it: NUMA binding,
/// prefault and placement.
fn settle_kept(
    mut pool: Pool,
    plan: &PoolPlan,
    observer: &dyn Observer,
    cancel: &Cancel,
) -> Result<Pool> {
    bind(&mut pool, plan, None)?;
    let faulted = prefault(&mut pool, plan, observer, cancel);
    pool.report.prefault = Some(faulted?);
    check_placement(&mut pool, plan)?;
    Ok(pool)
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

/// What [`map`] made: a pool, or (a lease no keeper answered, with a
/// fallback) the plan to build instead and why.
enum Mapped<'p> {
    Pool(Box<Pool>),
    Fallback(&'p PoolPlan, String),
}

/// The mapping of the plan's source, in a [`Pool`] with its first report: a
/// keeper's lease (or, when no keeper answers and the plan has a fallback,
/// that plan), the backing's own memory, or the files it planned, which the
/// core creates, maps and (for a shared pool) shares.
fn map<'p>(
    plan: &'p PoolPlan,
    observer: &dyn Observer,
    options: &BuildOptions<'_>,
) -> Result<Mapped<'p>> {
    let mapped = |attachment: Box<dyn Attachment>, map_secs: f64| {
        let attached = attachment.attached();
        let report = first_report(plan, attachment.region(), &attached, map_secs);
        Mapped::Pool(Box::new(Pool::of(attachment, attached, report)))
    };
    let (memory, share) = match &plan.source {
        Source::Leased(lease) => {
            return match lease_of(lease, observer, options) {
                Ok((attachment, secs)) => Ok(mapped(attachment, secs)),
                Err(crate::Error::Keeper {
                    absent: true,
                    message,
                    ..
                }) if lease.fallback.is_some() => Ok(Mapped::Fallback(
                    lease.fallback.as_deref().ok_or_else(gone)?,
                    message,
                )),
                Err(e) => Err(e),
            };
        }
        Source::Own(memory) => (memory, None),
        Source::Shared(share) => (&share.memory, Some(share)),
        Source::Kept(_) => {
            return Err(crate::Error::config(
                "a kept pool's plan is built by its keeper (Pool::build_kept)",
            ));
        }
    };
    let bp = &memory.plan;
    // A shared pool's creator checks capacity itself: once it has reserved
    // the pages, the counts look too low to joiners.
    if share.is_none() {
        capacity::require(&bp.capacity)?;
    }
    let (mapping, map_secs) = timed(observer, Phase::Map, bp.size.mapped(), || {
        match (&bp.source, share) {
            (MemorySource::Files(files), Some(share)) => {
                share_of(plan, memory, files, share, options)
            }
            (MemorySource::Files(files), None) => {
                Ok(Box::new(crate::file::map_planned(files, bp.size)?) as Box<dyn Attachment>)
            }
            // The plan refuses to share memory of a backing's own.
            (MemorySource::Own, _) => memory
                .backing
                .map(bp)
                .map(|m| Box::new(OwnMapping(m)) as Box<dyn Attachment>),
        }
    });
    Ok(mapped(mapping?, map_secs))
}

/// The report of a pool of `plan` just mapped at `region`.
fn first_report(
    plan: &PoolPlan,
    region: Region<'_>,
    attached: &Attached,
    map_secs: f64,
) -> PoolReport {
    PoolReport::first(
        plan.backing_plan(),
        plan.pin().map_or(crate::PIN_OFF, |p| p.pinner.name()),
        plan.huge_pages().cloned(),
        region,
        attached,
        map_secs,
    )
}

/// The lease's mapping, from the build's handoff, and the seconds it took.
fn lease_of(
    lease: &LeasePlan,
    observer: &dyn Observer,
    options: &BuildOptions<'_>,
) -> Result<(Box<dyn Attachment>, f64)> {
    let handoff = options.handed("a lease of a kept pool")?;
    let (leased, secs) = timed(observer, Phase::Map, lease.size.unwrap_or(0), || {
        handoff.lease(lease, &options.cancel)
    });
    Ok((leased?, secs))
}

impl Pool {
    /// A pool of `mapping`, which came as `attached`, with its first
    /// report, nothing pinned yet.
    fn of(mapping: Box<dyn Attachment>, attached: Attached, report: PoolReport) -> Pool {
        Pool {
            mapping: Some(crate::sys::Owner::new(mapping)),
            pin: None,
            background: None,
            pin_extent: None,
            registrations: Vec::new(),
            attached,
            report,
            owner: std::process::id(),
        }
    }
}

/// A shared pool's mapping, over the build's handoff, of the files its plan
/// named.
fn share_of(
    plan: &PoolPlan,
    memory: &Memory,
    files: &FilePlan,
    share: &Share,
    options: &BuildOptions<'_>,
) -> Result<Box<dyn Attachment>> {
    let bp = &memory.plan;
    let _ = plan;
    options
        .handed("a shared pool")?
        .share(crate::shared::SharedPoolSpec {
            sharing: &share.sharing,
            size: bp.size,
            files: share
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
    let leased = matches!(plan.source, Source::Leased(_));
    if (plan.ranks().is_none() && !leased)
        || plan.pin.as_ref().is_none_or(|p| p.scope != PinScope::Pool)
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
    let leased = matches!(plan.source, Source::Leased(_));
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
    let Some(pin_plan) = &plan.pin else {
        return Ok(());
    };
    let pinner = &pin_plan.pinner;
    let mapped = held(&pool.mapping)?.region().mapped_len();
    let pin_extent = match (plan.ranks(), pin_plan.scope, &plan.source) {
        // A leased pool's shard is of the keeper's size, not the plan's.
        (Some(s), PinScope::Shard, Source::Leased(_)) => {
            let region = held(&pool.mapping)?.region();
            crate::shared::shard(region.size(), s)?
        }
        (Some(_), PinScope::Shard, _) => plan.prefault.extent,
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
    if let Some(chunk) = pin_plan.background_chunk {
        // The thread runs on the mapping's owner, which joins it before the
        // mapping goes; the pool stops it first in `release`.
        let owner = pool.mapping.as_mut().ok_or_else(gone)?;
        let started = Background::start(
            owner,
            pin_extent,
            std::sync::Arc::clone(pinner),
            crate::background::Settings {
                chunk,
                chunk_asked: pin_plan.chunk_asked,
                required: pin_plan.required,
                context: plan.context,
            },
        )?;
        pool.report.pin.status = PinStatus::Pinning;
        pool.report.pin.details = super::report::background_details(started.chunk(), pin_extent);
        pool.background = Some(started);
        return Ok(());
    }
    let region = held(&pool.mapping)?.region();
    let pin_region = region.sub(pin_extent).ok_or_else(gone)?;
    let (pinned, secs) = timed(observer, Phase::Pin, pin_region.mapped_len(), || {
        pinner.pin(pin_region, &plan.context)
    });
    pool.report.phases.pin = Some(secs);
    match pinned {
        Ok(pin) => {
            pool.report.pin.status = PinStatus::Pinned;
            pool.report.pin.details = pin.details();
            pool.pin = Some(pin);
        }
        Err(e) if !pin_plan.required => {
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
            let reg = r.register(region, &plan.context)?;
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

impl Mapping for OwnMapping {
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

impl Attachment for OwnMapping {}
